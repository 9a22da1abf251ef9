#!/usr/bin/python3
"""tests/tools/llama_oracle.py — PyTorch's Llama as the oracle of the C model.

    llama_oracle.py make DIR [--layers L] [--embd C] [--heads NH] [--kv NKV]
                             [--head-dim hd] [--ffn F] [--vocab V] [--max-pos P]
                             [--tied 0|1] [--llama3 0|1] [--theta X] [--shards S]
        write an HF Llama model directory: DIR/config.json (LlamaConfig's keys),
        random weights under LlamaForCausalLM's names and shapes, as
        DIR/model.safetensors or, with S > 1, S files and
        model.safetensors.index.json; and DIR/data.bin, an llm.c "llama-3"
        token shard (4-byte tokens, magic 20240801, version 7).
    llama_oracle.py check DIR OUT WORLD B T OUT.txt [--mask K] [--variant NAME]
        compare what tests/progs/llama_check --init DIR --out OUT wrote
        (OUT.txt: its stdout; OUT/logits.f32, OUT/after/*.f32) with the
        reference below on the model and data of DIR; print one "ok"/"FAIL"
        line per check; exit 1 on any failure.
    llama_oracle.py init DIR OUT OTHER
        check OUT/init/*.f32 (llama_check --dump-init) against HF's
        _init_weights for the config of DIR (std 0.02 normal Linear and
        Embedding weights, RMSNorm weights 1) and, when OTHER is not "-", that
        OTHER/init holds the same bits (another layout).

The reference is an independent Llama written here in plain torch, float64:
LlamaRMSNorm, rotate_half RoPE with cos/sin of positions 0..T-1 (Llama 3's
frequency scaling as HF's _compute_llama3_parameters), repeat_kv grouped-query
attention (query head h reads kv head h // (NH / NKV)), causal softmax scaled by
1/sqrt(hd), the SwiGLU MLP, the tied or untied head and mean cross-entropy over
targets >= 0. It uses nothing of HF or of the C code. So what it measures is the
C code's float32 error.

The world is data parallel: rank r of W takes tokens [pos + r*B*T, ... + B*T + 1)
of each global batch (llm.c's DataLoader), and the loss is the mean over ranks
of each rank's mean, as the engine averages gradients over the world.

Bounds (float32 against float64; measured figures in docs/llama.md):
- logits: max |ours - ref| <= 1e-5 x max |ref| (f32 rounding through L layers
  of sums done in double: a few 1e-7 expected);
- loss of step 1 and the engine's gradient norm: 1e-5 and 1e-4 relative;
- every parameter's gradient, taken as p0 - p1 of the lr = eps = 1e6 step:
  max |ours - ref| <= 1e-4 x max |ref| + 2^-24 x max |p0|, per tensor. The
  second term is the resolution of the measurement: p1 is rounded to f32, so
  p0 - p1 is known to half an ulp of the parameter, whatever the gradient;
- 10 AdamW steps (lr 1e-3, weight decay 0.01 except RMSNorm weights, clip 1.0,
  torch.optim.AdamW): the loss and the gradient norm of each step within 1e-4
  relative, and the loss of the first batch falls over the steps.

--fp8 stacked: the reference's layer products take their operands through
FP8 as llama_check --fp8 1 does (docs/fp8.md, current scaling): the input and
the weight in E4M3, the output's gradient in E5M2, each at the scale that maps
its largest magnitude to the format's largest value, the conversions those of
tests/tools/fp8_oracle.py (from the formats' definitions), the products in
float64. q, k and v are one product over the stacked weight [Wq; Wk; Wv], and
gate and up another, so each stack has one scale per operand, as the cuda
model computes them. --fp8 perpart scales each of q, k, v, gate and up on its
own, to show that the comparison tells the two apart. The values converted
are the reference's float64 ones rounded to float32; they differ from the C
code's float32 values in the last bits, which once in a while moves a value
across an FP8 rounding boundary (one step of the format: 1/16 or 1/8 of it),
so the FP8 bounds are wider than float32's. Measured (1x1 GQA, MHA, and MHA
2x2, where such a crossing happens in the first step's E5M2 gradients):
without a crossing every figure is float32's (loss 3e-8, logits 2e-7, a
gradient 4e-6 of its tensor); the crossing moves the gradient norm by 1.1e-4
and v_proj's gradient by 8.5e-3 of its norm (4.8e-2 of its largest element,
hence the norm of the error here, not its largest element), and once the 10
steps meet one, the steps after part slowly (at worst 4.3e-3 in the loss,
1.4e-2 in the norm). --fp8 perpart instead: loss 9e-4 to 2.9e-3, logits
7e-2 to 1.5e-1 of the largest, every gradient 4e-2 to 3e-1 of its norm off.
The FP8 bounds: loss 1e-4, logits 1e-3, gradient norm 2e-3, a gradient 2e-2
of its norm, the 10 steps' losses and norms 3e-2.

--fp8-history H (with --fp8 stacked) checks llama_check --fp8 1
--fp8-history H: the 10 steps at delayed scaling over H passes (H 0:
current scaling), the reference keeping its own records and windows (Plan,
written from docs/fp8.md), and one more line: every step's loss within 1e-4
of the reference's. Measured on GQA 1x1 with H 2: 5.5e-8 at worst over the 10
steps; against a reference with a window of 1 or 3 passes, or at current
scaling, 1.4e-3 to 3.8e-3 from the step where the scales part (steps 2-4).
A rounding boundary crossed also parts the runs (MHA 1x1 does from step 3),
so this line is for models whose 10 steps cross none.

--variant changes the reference, not the C code, to show that the comparison
notices a Llama that differs in one convention: "interleaved" (RoPE on pairs
(2i, 2i+1), the Meta/GPT-J layout), "noscale" (Llama 3's frequency scaling
left out), "kvmod" (query head h reads kv head h % NKV), "layernorm" (the
norms subtract the mean, as GPT-2's LayerNorm does). Each must make check fail.
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fp8_oracle  # noqa: E402

SHARD_MAGIC, SHARD_VERSION = 20240801, 7  # llm.c's "llama-3" shards
LAYER = [  # HF names of one layer's tensors; shapes from the config
    "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
    "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
]


# ---------------------------------------------------------------- files

def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a, dtype=np.float32)
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        blobs.append(a.tobytes())
        off += a.nbytes
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        assert h["dtype"] == "F32", (name, h["dtype"])
        b, e = h["data_offsets"]
        out[name] = np.frombuffer(data[b:e], dtype=np.float32).reshape(h["shape"]).astype(np.float64)
    return out


def read_model(d):
    """Every tensor of the model directory d: model.safetensors when d has one,
    else the files of its index (from_pretrained's order)."""
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.isfile(os.path.join(d, "model.safetensors")) or not os.path.exists(index):
        return read_safetensors(os.path.join(d, "model.safetensors"))
    out = {}
    for f in sorted(set(json.load(open(index))["weight_map"].values())):
        out.update(read_safetensors(os.path.join(d, f)))
    return out


def shapes(cfg):
    C, F_, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    Q = cfg["num_attention_heads"] * cfg["head_dim"]
    KV = cfg["num_key_value_heads"] * cfg["head_dim"]
    layer = {"input_layernorm.weight": (C,), "self_attn.q_proj.weight": (Q, C),
             "self_attn.k_proj.weight": (KV, C), "self_attn.v_proj.weight": (KV, C),
             "self_attn.o_proj.weight": (C, Q), "post_attention_layernorm.weight": (C,),
             "mlp.gate_proj.weight": (F_, C), "mlp.up_proj.weight": (F_, C),
             "mlp.down_proj.weight": (C, F_)}
    out = {"model.embed_tokens.weight": (V, C)}
    for l in range(cfg["num_hidden_layers"]):
        for n in LAYER:
            out["model.layers.%d.%s" % (l, n)] = layer[n]
    out["model.norm.weight"] = (C,)
    if not cfg["tie_word_embeddings"]:
        out["lm_head.weight"] = (V, C)
    return out


def make(d, a):
    os.makedirs(d, exist_ok=True)
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": a.vocab, "hidden_size": a.embd, "intermediate_size": a.ffn,
        "num_hidden_layers": a.layers, "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv, "head_dim": a.head_dim, "max_position_embeddings": a.max_pos,
        "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": a.theta,
        "rope_scaling": None, "tie_word_embeddings": bool(a.tied), "attention_bias": False,
        "mlp_bias": False, "attention_dropout": 0.0, "pretraining_tp": 1,
        "initializer_range": 0.02, "bos_token_id": None, "eos_token_id": None,
        "torch_dtype": "float32",
    }
    if a.llama3:
        # Original context 256: wavelengths under 64 are kept, over 256 divided by
        # the factor, those between smoothed. At theta 5e5 the wavelengths 2 pi
        # theta^(2i/hd) are 6.3, 167, 4443, ... for hd 8 and 6.3, 33, 167, 864, ...
        # for hd 16: all three bands occur.
        cfg["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 256}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    rng = np.random.default_rng(20240901 + 7 * a.layers + a.heads + 3 * a.kv + a.tied)
    t = {}
    for name, shape in shapes(cfg).items():
        if name.endswith("norm.weight"):
            t[name] = 1 + rng.normal(0, 0.1, shape)
        elif name == "model.embed_tokens.weight":
            # Tied, the embedding is the head too: 1/sqrt(C) keeps the logits
            # O(1) (unit rows would make them ~sqrt(C) and the softmax one-hot).
            t[name] = rng.normal(0, 1 / math.sqrt(shape[1]) if a.tied else 1.0, shape)
        else:  # nn.Linear (out, in): unit-variance outputs
            t[name] = rng.normal(0, 1 / math.sqrt(shape[1]), shape)
    names = list(t)
    if a.shards <= 1:
        write_safetensors(os.path.join(d, "model.safetensors"), t)
    else:
        per = -(-len(names) // a.shards)
        wmap = {}
        for s in range(a.shards):
            fn = "model-%05d-of-%05d.safetensors" % (s + 1, a.shards)
            part = {n: t[n] for n in names[s * per:(s + 1) * per]}
            write_safetensors(os.path.join(d, fn), part)
            wmap.update({n: fn for n in part})
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": 4 * sum(v.size for v in t.values())},
                       "weight_map": wmap}, f, indent=2)
    n = 6000
    tokens = rng.integers(0, a.vocab, n).astype(np.uint32)
    hdr = np.zeros(256, dtype=np.int32)
    hdr[0], hdr[1], hdr[2] = SHARD_MAGIC, SHARD_VERSION, n
    with open(os.path.join(d, "data.bin"), "wb") as f:
        f.write(hdr.tobytes() + tokens.tobytes())


# ---------------------------------------------------------------- the reference

def inv_freq(cfg, variant):
    hd, theta = cfg["head_dim"], cfg["rope_theta"]
    f = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    rs = cfg.get("rope_scaling")
    if rs and variant != "noscale":
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        wavelen = 2 * math.pi / f
        scaled = torch.where(wavelen > old / lo, f / factor, f)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old / hi) & (wavelen <= old / lo)
        f = torch.where(medium, smoothed, scaled)
    return f


def rope(x, freqs, variant):
    """x (B, H, T, hd) rotated at positions 0..T-1."""
    T, hd = x.shape[2], x.shape[3]
    ang = torch.arange(T, dtype=torch.float64)[:, None] * freqs[None, :]  # (T, hd/2)
    if variant == "interleaved":
        x1, x2 = x[..., 0::2], x[..., 1::2]
        c, s = ang.cos(), ang.sin()
        return torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
    emb = torch.cat((ang, ang), dim=-1)
    rot = torch.cat((-x[..., hd // 2:], x[..., :hd // 2]), dim=-1)  # rotate_half
    return x * emb.cos() + rot * emb.sin()


def rms(x, w, eps, variant=None):
    if variant == "layernorm":
        x = x - x.mean(-1, keepdim=True)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


# ---------------------------------------------------------------- FP8

FP8 = None  # None, "stacked" or "perpart" (check --fp8)
# The check's relative bounds, float32 against float64 (the docstring), and
# with FP8 (set below once measured)
BOUNDS = dict(loss=1e-5, logits=1e-5, norm=1e-4, grad=1e-4, traj=1e-4)
FP8_BOUNDS = dict(loss=1e-4, logits=1e-3, norm=2e-3, grad=2e-2, traj=3e-2)


class Plan:
    """Delayed scaling's bookkeeping for one rank (nn_fp8_plan_t, docs/fp8.md
    "Delayed scaling"), written from the docs: a pass is a micro-batch's
    forward and backward; each operand's record is the largest magnitude of
    its conversions in the pass; when a forward begins after a backward has
    ended, the records close into a window of the last `history` passes and
    each operand's scale for the new pass comes from the window's largest
    record. The first pass runs at current scaling; history 0 always does."""

    def __init__(self, history):
        self.history, self.delayed, self.ended = history, False, False
        self.window, self.rec = {}, {}

    def begin(self):
        if not self.ended:
            return
        for key, r in self.rec.items():
            self.window.setdefault(key, []).append(r)
            del self.window[key][:-self.history or None]
        self.rec, self.delayed, self.ended = {}, self.history > 0, False

    def scale(self, key, kind):
        """None: current scaling; else the scale of key's window."""
        if not self.delayed:
            return None
        return fp8_oracle.scale_of(max(self.window[key]), kind, 0)

    def record(self, key, amax):
        self.rec[key] = max(self.rec.get(key, 0.0), amax)


PLAN = None  # the Plan of the rank whose forward runs (check --fp8-history)
WHERE = None  # (layer, product) of the FP8Linear about to run


def fp8_roundtrip(t, kind, key=None):
    """t (float64) as it comes back from FP8: rounded to float32, times the
    scale (float32; current scaling: from t's own largest magnitude; delayed:
    PLAN's for key), converted (saturating), decoded, divided by the scale
    (float32), as nn_fp8_roundtrip and the delayed conversions do. With a
    PLAN, t's largest magnitude goes into key's record."""
    a = t.detach().numpy().astype(np.float32)
    amax = np.abs(a).max()
    scale = PLAN.scale(key, kind) if PLAN else None
    if PLAN:
        PLAN.record(key, float(amax))
    if scale is None:
        scale = fp8_oracle.scale_of(amax, kind, 0)
    assert scale > 0, "an operand FP8 cannot scale"
    y = (a * scale).astype(np.float32).astype(np.float64)
    dec = fp8_oracle.decode_table(kind)[fp8_oracle.encode(y.ravel(), kind)].reshape(a.shape)
    return torch.tensor((dec.astype(np.float32) / scale).astype(np.float64))


class FP8Linear(torch.autograd.Function):
    """x (..., IC) W^T for W (OC, IC), every operand through FP8."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.where, ctx.plan = WHERE, PLAN
        xq, wq = fp8_roundtrip(x, "e4m3", WHERE + (0,)), fp8_roundtrip(w, "e4m3", WHERE + (1,))
        ctx.save_for_backward(xq, wq)
        return xq @ wq.T

    @staticmethod
    def backward(ctx, g):
        global PLAN
        xq, wq = ctx.saved_tensors
        saved, PLAN = PLAN, ctx.plan
        gq = fp8_roundtrip(g, "e5m2", ctx.where + (2,))
        PLAN = saved
        return gq @ wq, gq.reshape(-1, gq.shape[-1]).T @ xq.reshape(-1, xq.shape[-1])


def linears(h, ws, where=(0, 0)):
    """h W^T for each W of ws (a stack: one product over them under FP8);
    where: (layer, product 0 q|k|v, 1 o, 2 gate|up, 3 down)."""
    global WHERE
    WHERE = where
    if FP8 is None:
        return [h @ w.T for w in ws]
    if FP8 == "perpart" or len(ws) == 1:
        return [FP8Linear.apply(h, w) for w in ws]
    out = FP8Linear.apply(h, torch.cat(ws))
    return list(out.split([w.shape[0] for w in ws], dim=-1))


def llama(p, cfg, idx, variant=None):
    """Logits (B,T,V) of HF's LlamaForCausalLM from parameters p (float64)."""
    B, T = idx.shape
    NH, NKV, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg["rms_norm_eps"]
    freqs = inv_freq(cfg, variant)
    if variant == "kvmod":
        kv_of = torch.arange(NH) % NKV
    else:
        kv_of = torch.arange(NH) // (NH // NKV)  # repeat_kv
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    x = p["model.embed_tokens.weight"][idx]
    for l in range(cfg["num_hidden_layers"]):
        w = lambda n: p["model.layers.%d.%s" % (l, n)]
        h = rms(x, w("input_layernorm.weight"), eps, variant)
        q, k, v = linears(h, [w("self_attn.%s_proj.weight" % n) for n in "qkv"], (l, 0))
        q = q.reshape(B, T, NH, hd).transpose(1, 2)
        k = k.reshape(B, T, NKV, hd).transpose(1, 2)
        v = v.reshape(B, T, NKV, hd).transpose(1, 2)
        q, k = rope(q, freqs, variant), rope(k, freqs, variant)
        k, v = k[:, kv_of], v[:, kv_of]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, NH * hd)
        x = x + linears(y, [w("self_attn.o_proj.weight")], (l, 1))[0]
        h = rms(x, w("post_attention_layernorm.weight"), eps, variant)
        g, u = linears(h, [w("mlp.gate_proj.weight"), w("mlp.up_proj.weight")], (l, 2))
        x = x + linears(g * torch.sigmoid(g) * u, [w("mlp.down_proj.weight")], (l, 3))[0]
    x = rms(x, p["model.norm.weight"], eps, variant)
    head = p["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else p["lm_head.weight"]
    return x @ head.T


def batches(tokens, world, B, T, step, mask):
    """The (inputs, targets) of every rank for global batch `step` (0-based)."""
    pos = step * world * B * T
    out = []
    for r in range(world):
        s = tokens[pos + r * B * T: pos + r * B * T + B * T + 1].astype(np.int64)
        y = s[1:].copy()
        if mask:
            y[mask - 1::mask] = -1
        out.append((torch.tensor(s[:-1]).view(B, T), torch.tensor(y).view(B, T)))
    return out


def world_loss(p, cfg, bs, variant, plans=None):
    """The world's mean loss; plans: each rank's FP8 Plan (delayed scaling),
    a pass begun for each; the caller's backward ends them (end_passes)."""
    global PLAN
    V = cfg["vocab_size"]
    total = 0
    for r, (x, y) in enumerate(bs):
        PLAN = plans[r] if plans else None
        if PLAN:
            PLAN.begin()
        total = total + F.cross_entropy(llama(p, cfg, x, variant).reshape(-1, V), y.reshape(-1),
                                        ignore_index=-1)
    PLAN = None
    return total / len(bs)


def end_passes(plans):
    for pl in plans or ():
        pl.ended = True


# ---------------------------------------------------------------- the checks

FAILED = []


def report(ok, msg):
    print(("ok   " if ok else "FAIL ") + msg)
    if not ok:
        FAILED.append(msg)


def check(d, out, world, B, T, out_txt, mask, variant, fp8, history=None):
    global FP8
    FP8 = fp8
    bd = FP8_BOUNDS if fp8 else BOUNDS
    torch.set_default_dtype(torch.float64)
    cfg = json.load(open(os.path.join(d, "config.json")))
    w = read_model(d)
    names = list(shapes(cfg))
    p = {k: torch.tensor(w[k], requires_grad=True) for k in names}
    raw = open(os.path.join(d, "data.bin"), "rb").read()
    tokens = np.frombuffer(raw[1024:], dtype=np.uint32)
    text = open(out_txt).read().splitlines()
    lines = dict(l.split(None, 1) for l in text if l.startswith(("loss1", "norm1")))
    traj = [tuple(map(float, l.split()[2:4])) for l in text if l.startswith("traj ")]
    if "loss1" not in lines or "norm1" not in lines:
        report(False, "%s has no loss1 and norm1 lines" % out_txt)
        return 1

    bs = batches(tokens, world, B, T, 0, mask)
    loss = world_loss(p, cfg, bs, variant)
    loss.backward()
    ours = float(lines["loss1"])
    e = abs(ours - loss.item()) / abs(loss.item())
    report(e <= bd["loss"], "loss of step 1: ours %.9f, torch %.9f: error %.1e (bound %.0e relative)"
           % (ours, loss.item(), e, bd["loss"]))
    with torch.no_grad():
        logits = llama(p, cfg, bs[0][0], variant).numpy()
    mine = np.fromfile(os.path.join(out, "logits.f32"), dtype=np.float32)
    if mine.size != logits.size:
        report(False, "logits.f32 holds %d values, not %d" % (mine.size, logits.size))
        return 1
    e = np.abs(mine.reshape(logits.shape) - logits).max() / np.abs(logits).max()
    report(e <= bd["logits"], "logits of rank 0's micro-batch: max error %.2e of the largest "
           "(bound %.0e)" % (e, bd["logits"]))
    norm = math.sqrt(sum(float((t.grad ** 2).sum()) for t in p.values()))
    ours = float(lines["norm1"])
    e = abs(ours - norm) / norm
    report(e <= bd["norm"], "gradient norm: ours %.9f, torch %.9f: error %.1e (bound %.0e relative)"
           % (ours, norm, e, bd["norm"]))
    worst, worst_name, count, bad = 0.0, "", 0, 0
    for name in names:
        f = os.path.join(out, "after", name + ".f32")
        if not os.path.exists(f):
            report(False, "no %s" % f)
            continue
        after = np.fromfile(f, dtype=np.float32).astype(np.float64).reshape(w[name].shape)
        g_ours = w[name] - after  # one AdamW step with lr = eps = 1e6 moves by -g
        g_ref = p[name].grad.numpy()
        scale = np.abs(g_ref).max()
        if fp8:  # the whole tensor's error (an FP8 rounding boundary crossed moves a row)
            scale = np.linalg.norm(g_ref)
            err = np.linalg.norm(g_ours - g_ref)
            what = "norm of the error %.2e of the gradient's %.2e"
        else:
            err = np.abs(g_ours - g_ref).max()
            what = "max error %.2e of the largest %.2e"
        bound = bd["grad"] * scale + 2.0 ** -24 * np.abs(w[name]).max()
        e = err / max(scale, 1e-300)
        if e > worst:
            worst, worst_name = e, name
        count += 1
        if err > bound:
            bad += 1
            report(False, ("gradient of %s: " + what + " (bound %.2e)") % (name, err, scale, bound))
    want = 2 + 9 * cfg["num_hidden_layers"] + (0 if cfg["tie_word_embeddings"] else 1)
    report(count == want and count == len(names) and bad == 0,
           "gradients of all %d parameters compared (of %d), %d out of bounds; worst %.2e of "
           "the %s (%s)" % (count, want, bad, worst, "norm" if fp8 else "largest", worst_name))

    # 10 AdamW steps from the same weights, torch.optim.AdamW as the engine does it.
    p = {k: torch.tensor(w[k], requires_grad=True) for k in names}
    decay = [t for k, t in p.items() if not k.endswith("norm.weight")]
    no_decay = [t for k, t in p.items() if k.endswith("norm.weight")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": no_decay, "weight_decay": 0.0}], lr=1e-3, foreach=False)
    ref = []
    plans = [Plan(history) for _ in range(world)] if fp8 and history else None
    for s in range(len(traj)):
        opt.zero_grad()
        loss = world_loss(p, cfg, batches(tokens, world, B, T, s, mask), variant, plans)
        loss.backward()
        end_passes(plans)
        n = torch.nn.utils.clip_grad_norm_(list(p.values()), 1.0)
        opt.step()
        ref.append((loss.item(), float(n)))
    report(len(traj) == 10, "10 training steps reported (%d)" % len(traj))
    el = max((abs(a[0] - b[0]) / b[0] for a, b in zip(traj, ref)), default=1)
    en = max((abs(a[1] - b[1]) / b[1] for a, b in zip(traj, ref)), default=1)
    report(el <= bd["traj"] and en <= bd["traj"],
           "loss and gradient norm over 10 AdamW steps: worst relative errors %.1e, %.1e "
           "(bound %.0e); ours %s, torch %s" % (el, en, bd["traj"], " ".join("%.5f" % x[0] for x in traj[::3]),
                                               " ".join("%.5f" % x[0] for x in ref[::3])))
    if fp8 and history is not None:  # the scaling's bookkeeping, step by step
        el = max((abs(a[0] - b[0]) / b[0] for a, b in zip(traj, ref)), default=1)
        how = "delayed scaling over %d passes" % history if history else "current scaling"
        report(el <= 1e-4, "%s: every step's loss within 1e-4 of the reference's bookkeeping "
               "(worst %.1e; a window of another length, or current scaling, parts from the step "
               "its scales differ by 1e-3 or more)" % (how, el))
    # The steps train: the loss of the first batch falls (each step's own batch
    # differs, so the trajectory itself is noisy).
    with torch.no_grad():
        after = world_loss(p, cfg, batches(tokens, world, B, T, 0, mask), variant).item()
    report(bool(ref) and after < ref[0][0], "the 10 steps train: the first batch's loss falls "
           "(%.4f -> %.4f)" % (ref[0][0] if ref else math.nan, after))
    return 1 if FAILED else 0


def check_init(d, out, other):
    cfg = json.load(open(os.path.join(d, "config.json")))
    for name, shape in shapes(cfg).items():
        f = os.path.join(out, "init", name + ".f32")
        a = np.fromfile(f, dtype=np.float32)
        if a.size != int(np.prod(shape)):
            report(False, "%s holds %d values, not %d" % (f, a.size, int(np.prod(shape))))
            continue
        if name.endswith("norm.weight"):
            report(bool((a == 1).all()), "%s: all ones (LlamaRMSNorm)" % name)
        else:
            # N(0, 0.02): the sample mean within 5 standard errors, the std within 10%
            m, s = float(a.mean()), float(a.std())
            ok = abs(m) <= 5 * 0.02 / math.sqrt(a.size) and abs(s - 0.02) <= 0.002
            report(ok, "%s: mean %.2e, std %.5f (HF: normal(0, 0.02))" % (name, m, s))
        if other != "-":
            b = np.fromfile(os.path.join(other, "init", name + ".f32"), dtype=np.float32)
            report(a.tobytes() == b.tobytes(), "%s: the same bits in the other layout" % name)
    return 1 if FAILED else 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("make")
    mk.add_argument("dir")
    for k, v in (("layers", 2), ("embd", 48), ("heads", 8), ("kv", 2), ("head-dim", 8), ("ffn", 96),
                 ("vocab", 101), ("max-pos", 64), ("tied", 0), ("llama3", 0), ("shards", 1)):
        mk.add_argument("--" + k, type=int, default=v)
    mk.add_argument("--theta", type=float, default=10000.0)
    ck = sub.add_parser("check")
    ck.add_argument("dir")
    ck.add_argument("outdir")
    for k in ("world", "B", "T"):
        ck.add_argument(k, type=int)
    ck.add_argument("out")
    ck.add_argument("--mask", type=int, default=0)
    ck.add_argument("--variant", choices=["interleaved", "noscale", "kvmod", "layernorm"])
    ck.add_argument("--fp8", choices=["stacked", "perpart"])
    ck.add_argument("--fp8-history", type=int)
    it = sub.add_parser("init")
    it.add_argument("dir")
    it.add_argument("outdir")
    it.add_argument("other")
    a = ap.parse_args()
    if a.cmd == "make":
        make(a.dir, a)
    elif a.cmd == "check":
        sys.exit(check(a.dir, a.outdir, a.world, a.B, a.T, a.out, a.mask, a.variant, a.fp8,
                       a.fp8_history))
    else:
        sys.exit(check_init(a.dir, a.outdir, a.other))
