#!/usr/bin/python3
"""tests/tools/generate_oracle.py — PyTorch as the oracle of bin/generate.

    generate_oracle.py make DIR --model gpt2|llama [--layers L] [--embd C] [--heads NH]
                                [--kv NKV] [--head-dim hd] [--ffn F] [--vocab V]
                                [--max-pos P] [--tied 0|1] [--llama3 0|1] [--theta X]
                                [--dtype f32|bf16] [--shards S] [--prefix 0|1]
                                [--seed N] [--logit-std X] [--attn-gain X]
        write a tiny random HF model directory: config.json (GPT2Config's or
        LlamaConfig's keys) and the weights under HF's names, F32 or BF16
        (rounded to nearest even), in model.safetensors or, with S > 1, S files
        and model.safetensors.index.json. GPT-2 with --prefix 1 names its
        tensors "transformer.h.0..." (GPT2LMHeadModel's state dict), with
        --prefix 0 "h.0..." and carries the attention-mask buffers
        "h.N.attn.bias" of the original files. The head's rows (wte, or
        lm_head and a tied embedding) have entries of about --logit-std (2) /
        sqrt(C) against the final norm's unit-rms output, so the logits spread
        by about that: a step's two largest are far apart (no ties in greedy
        decoding) and a temperature of 1 leaves a wide distribution. q and k
        are scaled by sqrt(--attn-gain) (4): with diffuse attention a random
        model repeats one token whatever the context, and greedy paths would
        test little.
    generate_oracle.py batch FILE
        one line of results per line of FILE (one torch start for them all):
          NAME greedy DIR PROMPT N           -> NAME ids I I ... gap G
          NAME follows DIR PROMPT IDS M      -> NAME follows K of N [then ...] ok|FAIL
          NAME replay DIR PROMPT N T K SEED  -> NAME ids I I ...
          NAME topk DIR PROMPT IDS K         -> NAME outside X of Y first Z
          NAME logits DIR PROMPT IDS DUMP [B] -> NAME logits E ok|FAIL
        PROMPT and IDS are comma-separated token ids ("-" for none); DUMP is
        `generate --dump-logits`'s file: one row of V f32 logits per new token.
        greedy: the argmax continuation of N tokens (the lowest index among
        equal logits) and G, the smallest gap between a step's two largest
        logits. follows: whether IDS (a bf16 decoder's greedy path) is the
        oracle's greedy path up to its first step whose two largest logits
        are within M, where it may leave it: K of the N ids are the oracle's,
        then (if K < N) "then I for the oracle's J at a gap of G", ok when G
        <= M. replay: the seeded draw that docs/generate.md describes
        (temperature, then top-k, then xoshiro256** seeded by splitmix64),
        here in Python on this oracle's logits. topk: how many of IDS (the C
        program's sampled path) are not among the K largest logits of their
        step, and the first such step (-1: none). logits: the largest error
        of the dumped logits along the path IDS, relative to each row's
        largest |logit|, and whether it is within B (1e-5 when not given;
        with B given the line is "NAME logits E mean M bound B ok|FAIL", M
        the mean over the rows).

The reference models are written here, in plain torch, float64, with a full
forward over the whole sequence at every step (no KV cache), from the weights
as the files hold them (BF16 widened exactly): GPT-2 as HF's GPT2LMHeadModel
(LayerNorm eps 1e-5, Conv1D (in, out) weights with biases, causal attention
scaled by 1/sqrt(head size), GELU with tanh, tied head) and Llama as
LlamaForCausalLM (RMSNorm with rms_norm_eps, rotate_half RoPE with rope_theta
and Llama 3's frequency scaling as _compute_llama3_parameters, repeat_kv: query
head h reads kv head h // (NH / NKV), SwiGLU, tied or untied head). Nothing of
HF or of the C code is used. Directories written by the trainers (their
config.json and sharded checkpoints) are read the same way.
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np

# ---------------------------------------------------------------- files

ST_DTYPES = {"F32": (np.float32, 4), "BF16": (np.uint16, 2), "F16": (np.float16, 2),
             "F64": (np.float64, 8)}


def to_bf16(a):
    """float array -> (uint16 bits, the float64 values they hold), rounded to nearest even."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    bits = u.astype(np.uint16)
    return bits, (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def write_safetensors(path, tensors, dtype):
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        raw = to_bf16(a)[0].tobytes() if dtype == "BF16" else \
            np.ascontiguousarray(a, dtype=np.float32).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
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
        t, size = ST_DTYPES[h["dtype"]]
        b, e = h["data_offsets"]
        a = np.frombuffer(data[b:e], dtype=t)
        if h["dtype"] == "BF16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        out[name] = a.astype(np.float64).reshape(h["shape"])
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


# ---------------------------------------------------------------- make

def gpt2_shapes(a):
    C, V, P = a.embd, a.vocab, a.max_pos
    out = {"wte.weight": (V, C), "wpe.weight": (P, C)}
    for l in range(a.layers):
        for n, s in [("ln_1.weight", (C,)), ("ln_1.bias", (C,)),
                     ("attn.c_attn.weight", (C, 3 * C)), ("attn.c_attn.bias", (3 * C,)),
                     ("attn.c_proj.weight", (C, C)), ("attn.c_proj.bias", (C,)),
                     ("ln_2.weight", (C,)), ("ln_2.bias", (C,)),
                     ("mlp.c_fc.weight", (C, 4 * C)), ("mlp.c_fc.bias", (4 * C,)),
                     ("mlp.c_proj.weight", (4 * C, C)), ("mlp.c_proj.bias", (C,))]:
            out["h.%d.%s" % (l, n)] = s
    out["ln_f.weight"], out["ln_f.bias"] = (C,), (C,)
    return out


def llama_shapes(a):
    C, F_, V, Q, KV = a.embd, a.ffn, a.vocab, a.heads * a.head_dim, a.kv * a.head_dim
    out = {"model.embed_tokens.weight": (V, C)}
    for l in range(a.layers):
        for n, s in [("input_layernorm.weight", (C,)), ("self_attn.q_proj.weight", (Q, C)),
                     ("self_attn.k_proj.weight", (KV, C)), ("self_attn.v_proj.weight", (KV, C)),
                     ("self_attn.o_proj.weight", (C, Q)),
                     ("post_attention_layernorm.weight", (C,)),
                     ("mlp.gate_proj.weight", (F_, C)), ("mlp.up_proj.weight", (F_, C)),
                     ("mlp.down_proj.weight", (C, F_))]:
            out["model.layers.%d.%s" % (l, n)] = s
    out["model.norm.weight"] = (C,)
    if not a.tied:
        out["lm_head.weight"] = (V, C)
    return out


def make(d, a):
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(a.seed)
    t = {}
    if a.model == "gpt2":
        cfg = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
               "vocab_size": a.vocab, "n_positions": a.max_pos, "n_ctx": a.max_pos,
               "n_embd": a.embd, "n_layer": a.layers, "n_head": a.heads, "n_inner": None,
               "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
               "tie_word_embeddings": True, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
               "attn_pdrop": 0.0, "bos_token_id": None, "eos_token_id": None,
               "torch_dtype": "float32" if a.dtype == "f32" else "bfloat16"}
        for name, shape in gpt2_shapes(a).items():
            if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                t[name] = 1 + rng.normal(0, 0.1, shape)
            elif name.endswith("bias"):
                t[name] = rng.normal(0, 0.1, shape)
            elif name == "wte.weight":  # the head: ln_f(x) (unit rms) . wte rows
                t[name] = rng.normal(0, a.logit_std / math.sqrt(shape[1]), shape)
            elif name == "wpe.weight":
                t[name] = rng.normal(0, 1.0, shape)
            else:  # Conv1D (in, out): unit-variance outputs
                t[name] = rng.normal(0, 1 / math.sqrt(shape[0]), shape)
                if name.endswith("c_attn.weight"):  # q and k: sharper attention
                    t[name][:, :2 * a.embd] *= math.sqrt(a.attn_gain)
        if a.prefix:
            t = {"transformer." + k: v for k, v in t.items()}
        else:  # the original files' causal-mask buffers, which loaders ignore
            for l in range(a.layers):
                t["h.%d.attn.bias" % l] = np.tril(np.ones((1, 1, a.max_pos, a.max_pos)))
    else:
        cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
               "vocab_size": a.vocab, "hidden_size": a.embd, "intermediate_size": a.ffn,
               "num_hidden_layers": a.layers, "num_attention_heads": a.heads,
               "num_key_value_heads": a.kv, "head_dim": a.head_dim,
               "max_position_embeddings": a.max_pos, "hidden_act": "silu",
               "rms_norm_eps": 1e-5, "rope_theta": a.theta, "rope_scaling": None,
               "tie_word_embeddings": bool(a.tied), "attention_bias": False, "mlp_bias": False,
               "attention_dropout": 0.0, "pretraining_tp": 1, "bos_token_id": None,
               "eos_token_id": None,
               "torch_dtype": "float32" if a.dtype == "f32" else "bfloat16"}
        if a.llama3:
            # Original context 256 at theta 5e5: with hd 8 the wavelengths are 6.3,
            # 167, 4443, 1.2e5: one band kept (< 64), one smoothed, two divided.
            cfg["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 256}
        for name, shape in llama_shapes(a).items():
            if name.endswith("norm.weight"):
                t[name] = 1 + rng.normal(0, 0.1, shape)
            elif name == "lm_head.weight" or (a.tied and name == "model.embed_tokens.weight"):
                # the head's rows against the final norm's unit-rms output
                t[name] = rng.normal(0, a.logit_std / math.sqrt(shape[1]), shape)
            elif name == "model.embed_tokens.weight":
                t[name] = rng.normal(0, 1.0, shape)
            else:  # nn.Linear (out, in): unit-variance outputs
                t[name] = rng.normal(0, 1 / math.sqrt(shape[1]), shape)
                if name.endswith(("q_proj.weight", "k_proj.weight")):  # sharper attention
                    t[name] *= math.sqrt(a.attn_gain)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    dtype = "F32" if a.dtype == "f32" else "BF16"
    names = list(t)
    if a.shards <= 1:
        write_safetensors(os.path.join(d, "model.safetensors"), t, dtype)
        return
    per = -(-len(names) // a.shards)
    wmap = {}
    for s in range(a.shards):
        fn = "model-%05d-of-%05d.safetensors" % (s + 1, a.shards)
        part = {n: t[n] for n in names[s * per:(s + 1) * per]}
        write_safetensors(os.path.join(d, fn), part, dtype)
        wmap.update({n: fn for n in part})
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": sum(v.size for v in t.values()) * 4},
                   "weight_map": wmap}, f, indent=2)


# ---------------------------------------------------------------- the reference models

class Model:
    """A model directory's config and weights (float64 torch tensors)."""

    def __init__(self, d):
        import torch
        self.cfg = json.load(open(os.path.join(d, "config.json")))
        w = read_model(d)
        if self.cfg["model_type"] == "gpt2":  # with or without "transformer."
            w = {(k[12:] if k.startswith("transformer.") else k): v for k, v in w.items()}
        self.w = {k: torch.tensor(v, dtype=torch.float64) for k, v in w.items()}

    def logits(self, ids):
        """(T, V) logits of every position of the sequence ids."""
        import torch
        x = torch.tensor(ids, dtype=torch.long)
        with torch.no_grad():
            if self.cfg["model_type"] == "gpt2":
                return gpt2(self.w, self.cfg, x)
            return llama(self.w, self.cfg, x)


def layernorm(x, w, b, eps=1e-5):
    m = x.mean(-1, keepdim=True)
    v = ((x - m) ** 2).mean(-1, keepdim=True)
    return (x - m) / (v + eps).sqrt() * w + b


def gelu_tanh(x):
    return 0.5 * x * (1 + ((2 / math.pi) ** 0.5 * (x + 0.044715 * x ** 3)).tanh())


def causal_softmax(att):
    import torch
    T = att.shape[-1]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    return att.masked_fill(~mask, float("-inf")).softmax(-1)


def gpt2(w, cfg, idx):
    T = idx.shape[0]
    C, NH = cfg["n_embd"], cfg["n_head"]
    hs = C // NH
    x = w["wte.weight"][idx] + w["wpe.weight"][:T]
    for l in range(cfg["n_layer"]):
        p = lambda n: w["h.%d.%s" % (l, n)]
        h = layernorm(x, p("ln_1.weight"), p("ln_1.bias"))
        qkv = h @ p("attn.c_attn.weight") + p("attn.c_attn.bias")
        q, k, v = (qkv[:, i * C:(i + 1) * C].view(T, NH, hs).transpose(0, 1) for i in range(3))
        att = causal_softmax((q @ k.transpose(-2, -1)) / math.sqrt(hs))
        y = (att @ v).transpose(0, 1).reshape(T, C)
        x = x + y @ p("attn.c_proj.weight") + p("attn.c_proj.bias")
        h = layernorm(x, p("ln_2.weight"), p("ln_2.bias"))
        h = gelu_tanh(h @ p("mlp.c_fc.weight") + p("mlp.c_fc.bias"))
        x = x + h @ p("mlp.c_proj.weight") + p("mlp.c_proj.bias")
    x = layernorm(x, w["ln_f.weight"], w["ln_f.bias"])
    return x @ w["wte.weight"].T


def inv_freq(cfg):
    import torch
    hd, theta = cfg["head_dim"], cfg.get("rope_theta", 10000.0)
    f = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    rs = cfg.get("rope_scaling")
    if rs and rs.get("rope_type", rs.get("type")) == "llama3":
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        wavelen = 2 * math.pi / f
        scaled = torch.where(wavelen > old / lo, f / factor, f)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old / hi) & (wavelen <= old / lo)
        f = torch.where(medium, smoothed, scaled)
    return f


def rope(x, freqs):
    """x (H, T, hd) rotated at positions 0..T-1, rotate_half layout."""
    import torch
    T, hd = x.shape[1], x.shape[2]
    ang = torch.arange(T, dtype=torch.float64)[:, None] * freqs[None, :]
    emb = torch.cat((ang, ang), dim=-1)
    rot = torch.cat((-x[..., hd // 2:], x[..., :hd // 2]), dim=-1)
    return x * emb.cos() + rot * emb.sin()


def rms(x, w, eps):
    return x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt() * w


def llama(w, cfg, idx):
    import torch
    T = idx.shape[0]
    NH = cfg["num_attention_heads"]
    NKV = cfg.get("num_key_value_heads", NH)
    hd = cfg.get("head_dim", cfg["hidden_size"] // NH)
    cfg = dict(cfg, head_dim=hd)
    eps = cfg.get("rms_norm_eps", 1e-6)
    freqs = inv_freq(cfg)
    kv_of = torch.arange(NH) // (NH // NKV)  # repeat_kv
    x = w["model.embed_tokens.weight"][idx]
    for l in range(cfg["num_hidden_layers"]):
        p = lambda n: w["model.layers.%d.%s" % (l, n)]
        h = rms(x, p("input_layernorm.weight"), eps)
        q = (h @ p("self_attn.q_proj.weight").T).view(T, NH, hd).transpose(0, 1)
        k = (h @ p("self_attn.k_proj.weight").T).view(T, NKV, hd).transpose(0, 1)
        v = (h @ p("self_attn.v_proj.weight").T).view(T, NKV, hd).transpose(0, 1)
        q, k = rope(q, freqs), rope(k, freqs)
        k, v = k[kv_of], v[kv_of]
        att = causal_softmax((q @ k.transpose(-2, -1)) / math.sqrt(hd))
        y = (att @ v).transpose(0, 1).reshape(T, NH * hd)
        x = x + y @ p("self_attn.o_proj.weight").T
        h = rms(x, p("post_attention_layernorm.weight"), eps)
        g = h @ p("mlp.gate_proj.weight").T
        x = x + (g * torch.sigmoid(g) * (h @ p("mlp.up_proj.weight").T)) @ \
            p("mlp.down_proj.weight").T
    x = rms(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else w["lm_head.weight"]
    return x @ head.T


# ---------------------------------------------------------------- the sampler, as documented

M64 = (1 << 64) - 1


class Rng:
    """xoshiro256**, its state from splitmix64 of the seed (docs/generate.md)."""

    def __init__(self, seed):
        x, self.s = seed & M64, []
        for _ in range(4):
            x = (x + 0x9E3779B97F4A7C15) & M64
            z = x
            z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
            self.s.append(z ^ (z >> 31))

    def next(self):
        s = self.s
        rotl = lambda x, k: ((x << k) | (x >> (64 - k))) & M64
        out = (rotl((s[1] * 5) & M64, 7) * 9) & M64
        t = (s[1] << 17) & M64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = rotl(s[3], 45)
        return out

    def uniform(self):
        return (self.next() >> 11) * 2.0 ** -53


def argmax(z):
    return int(np.argmax(z))  # the first of equal maxima


def draw(z, T, k, rng):
    V = len(z)
    if T == 0 or k == 1:
        return argmax(z)
    if 0 < k < V:
        cand = sorted(range(V), key=lambda i: (-z[i], i))[:k]
    else:
        cand = list(range(V))
    zmax = max(z[i] for i in cand)
    wts = [math.exp((z[i] - zmax) / T) for i in cand]
    total = 0.0
    for x in wts:
        total += x
    u = rng.uniform() * total
    run = 0.0
    for i, x in zip(cand, wts):
        run += x
        if run > u:
            return i
    return cand[-1]


# ---------------------------------------------------------------- batch

def ids_of(s):
    return [] if s == "-" else [int(x) for x in s.split(",")]


def batch(path):
    models = {}
    for line in open(path):
        f = line.split()
        if not f or f[0].startswith("#"):
            continue
        name, kind, d = f[0], f[1], f[2]
        if d not in models:
            models[d] = Model(d)
        m = models[d]
        prompt = ids_of(f[3])
        if kind in ("greedy", "replay"):
            n = int(f[4])
            T, k, rng = (float(f[5]), int(f[6]), Rng(int(f[7]))) if kind == "replay" else (0, 0, None)
            seq, gaps = list(prompt), []
            for _ in range(n):
                z = m.logits(seq)[-1].numpy()
                top = np.sort(z)[-2:]
                gaps.append(top[1] - top[0])
                seq.append(draw(z, T, k, rng) if rng else argmax(z))
            out = "%s ids %s" % (name, " ".join(map(str, seq[len(prompt):])))
            print(out + (" gap %.3g" % min(gaps) if kind == "greedy" else ""))
        elif kind == "follows":
            ids, margin, seq = ids_of(f[4]), float(f[5]), list(prompt)
            for s, mine in enumerate(ids):
                z = m.logits(seq)[-1].numpy()
                top, best = np.sort(z)[-2:], argmax(z)
                if best != mine:
                    gap = top[1] - top[0]
                    print("%s follows %d of %d, then %d for the oracle's %d at a gap of %.4g %s"
                          % (name, s, len(ids), mine, best, gap, "ok" if gap <= margin else "FAIL"))
                    break
                seq.append(mine)
            else:
                print("%s follows %d of %d ok" % (name, len(ids), len(ids)))
        elif kind == "topk":
            ids, k = ids_of(f[4]), int(f[5])
            z = m.logits(prompt + ids[:-1])[len(prompt) - 1:].numpy()
            outside = [s for s, i in enumerate(ids)
                       if i not in sorted(range(z.shape[1]), key=lambda j: (-z[s, j], j))[:k]]
            print("%s outside %d of %d first %d" % (name, len(outside), len(ids),
                                                    outside[0] if outside else -1))
        elif kind == "logits":
            ids = ids_of(f[4])
            z = m.logits(prompt + ids[:-1])[len(prompt) - 1:].numpy()
            dump = np.fromfile(f[5], dtype=np.float32).astype(np.float64)
            if dump.size != z.size:
                print("%s logits size %d not %d FAIL" % (name, dump.size, z.size))
                continue
            dump = dump.reshape(z.shape)
            rows = np.abs(dump - z).max(1) / np.abs(z).max(1)
            e = float(rows.max())
            if len(f) > 6:
                bound = float(f[6])
                print("%s logits %.2e mean %.2e bound %g %s" % (name, e, float(rows.mean()), bound,
                                                                "ok" if e <= bound else "FAIL"))
            else:
                print("%s logits %.2e %s" % (name, e, "ok" if e <= 1e-5 else "FAIL"))
        else:
            sys.exit("generate_oracle.py: %s: unknown kind %s" % (path, kind))
        sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("make")
    mk.add_argument("dir")
    mk.add_argument("--model", choices=["gpt2", "llama"], required=True)
    for opt, dflt in [("--layers", 2), ("--embd", 48), ("--heads", 4), ("--kv", 0),
                      ("--head-dim", 0), ("--ffn", 96), ("--vocab", 97), ("--max-pos", 64),
                      ("--tied", 0), ("--llama3", 0), ("--shards", 1), ("--prefix", 1),
                      ("--seed", 1)]:
        mk.add_argument(opt, type=int, default=dflt)
    mk.add_argument("--theta", type=float, default=10000.0)
    mk.add_argument("--logit-std", type=float, default=2.0)
    mk.add_argument("--attn-gain", type=float, default=4.0)
    mk.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    b = sub.add_parser("batch")
    b.add_argument("file")
    a = ap.parse_args()
    if a.cmd == "make":
        a.kv = a.kv or a.heads
        a.head_dim = a.head_dim or a.embd // a.heads
        make(a.dir, a)
    else:
        batch(a.file)


if __name__ == "__main__":
    main()
