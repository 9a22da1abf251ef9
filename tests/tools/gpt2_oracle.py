#!/usr/bin/python3
"""tests/tools/gpt2_oracle.py — PyTorch's GPT-2 as the oracle of the C trainer.

    gpt2_oracle.py make DIR          write DIR/model.safetensors (random GPT-2
                                     weights, HF names and shapes, with the
                                     attn.bias mask buffers HF files carry) and
                                     DIR/data.bin (an llm.c token shard)
    gpt2_oracle.py check DIR WORLD B T OUT.txt
                                     compare what tests/progs/gpt2_check wrote
                                     (OUT.txt: its stdout; DIR/logits.f32,
                                     DIR/after/*.f32) with PyTorch, print TAP-ish
                                     "ok"/"FAIL" lines, exit 1 on any failure.

The reference is an independent GPT-2 written here in plain torch (HF's
GPT2LMHeadModel math: pre-LayerNorm, causal attention, GELU tanh, tied LM head,
mean cross-entropy), in float64, so that what it measures is the C code's float32
error. The world is data parallel: rank r of W takes tokens [pos + r*B*T, ... +
B*T + 1) of each global batch (llm.c's DataLoader), and the loss is the mean over
ranks of each rank's mean, as the engine averages gradients over the world.
Bounds: logits and loss 1e-5 relative to the largest |value|; every gradient 1e-4
(max |ours - ref| / max |ref| per tensor); the loss after each of 10 AdamW steps
1e-4 relative (torch.optim.AdamW with the same decay groups and clip 1.0).
"""
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

V, C, NH, L, MAXT = 67, 32, 4, 2, 24
LAYER = [  # HF names and shapes of one layer, (in, out) for Conv1D weights
    ("ln_1.weight", (C,)), ("ln_1.bias", (C,)),
    ("attn.c_attn.weight", (C, 3 * C)), ("attn.c_attn.bias", (3 * C,)),
    ("attn.c_proj.weight", (C, C)), ("attn.c_proj.bias", (C,)),
    ("ln_2.weight", (C,)), ("ln_2.bias", (C,)),
    ("mlp.c_fc.weight", (C, 4 * C)), ("mlp.c_fc.bias", (4 * C,)),
    ("mlp.c_proj.weight", (4 * C, C)), ("mlp.c_proj.bias", (C,)),
]


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


def make(d):
    rng = np.random.default_rng(20240520)
    t = {"wte.weight": rng.normal(0, 0.3, (V, C)), "wpe.weight": rng.normal(0, 0.1, (MAXT, C)),
         "ln_f.weight": 1 + rng.normal(0, 0.1, C), "ln_f.bias": rng.normal(0, 0.1, C)}
    for l in range(L):
        for name, shape in LAYER:
            if name.startswith("ln_") and name.endswith("weight"):
                v = 1 + rng.normal(0, 0.1, shape)
            elif name.endswith("bias"):
                v = rng.normal(0, 0.05, shape)
            else:
                v = rng.normal(0, 0.15, shape)
            t["h.%d.%s" % (l, name)] = v
        t["h.%d.attn.bias" % l] = np.tril(np.ones((MAXT, MAXT)))[None, None]  # HF's mask buffer
    write_safetensors(os.path.join(d, "model.safetensors"), t)
    n = 40 * 4 * 2 * 16 + 1  # enough for 12 global batches of W=4, B=2, T=16 (and more)
    tokens = rng.integers(0, V, n).astype(np.uint16)
    hdr = np.zeros(256, dtype=np.int32)
    hdr[0], hdr[1], hdr[2] = 20240520, 1, n
    with open(os.path.join(d, "data.bin"), "wb") as f:
        f.write(hdr.tobytes() + tokens.tobytes())


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, h in header.items():
        b, e = h["data_offsets"]
        out[name] = np.frombuffer(data[b:e], dtype=np.float32).reshape(h["shape"]).astype(np.float64)
    return out


def gpt2(p, idx):
    """Logits (B,T,V) of HF GPT-2 from parameters p (torch float64)."""
    B, T = idx.shape
    x = p["wte.weight"][idx] + p["wpe.weight"][:T]
    hs = C // NH
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(L):
        q = lambda n: p["h.%d.%s" % (l, n)]
        h = F.layer_norm(x, (C,), q("ln_1.weight"), q("ln_1.bias"), 1e-5)
        qkv = h @ q("attn.c_attn.weight") + q("attn.c_attn.bias")
        qq, kk, vv = (t.view(B, T, NH, hs).transpose(1, 2) for t in qkv.split(C, dim=2))
        att = (qq @ kk.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ vv).transpose(1, 2).reshape(B, T, C)
        x = x + y @ q("attn.c_proj.weight") + q("attn.c_proj.bias")
        h = F.layer_norm(x, (C,), q("ln_2.weight"), q("ln_2.bias"), 1e-5)
        h = F.gelu(h @ q("mlp.c_fc.weight") + q("mlp.c_fc.bias"), approximate="tanh")
        x = x + h @ q("mlp.c_proj.weight") + q("mlp.c_proj.bias")
    x = F.layer_norm(x, (C,), p["ln_f.weight"], p["ln_f.bias"], 1e-5)
    return x @ p["wte.weight"].T


def batches(tokens, world, B, T, step):
    """The (inputs, targets) of every rank for global batch `step` (0-based)."""
    pos = step * world * B * T
    out = []
    for r in range(world):
        s = tokens[pos + r * B * T: pos + r * B * T + B * T + 1].astype(np.int64)
        out.append((torch.tensor(s[:-1]).view(B, T), torch.tensor(s[1:]).view(B, T)))
    return out


def world_loss(p, bs):
    return sum(F.cross_entropy(gpt2(p, x).reshape(-1, V), y.reshape(-1)) for x, y in bs) / len(bs)


FAILED = []


def report(ok, msg):
    print(("ok   " if ok else "FAIL ") + msg)
    if not ok:
        FAILED.append(msg)


def check(d, world, B, T, out_txt):
    torch.set_default_dtype(torch.float64)
    w = read_safetensors(os.path.join(d, "model.safetensors"))
    p = {k: torch.tensor(v, requires_grad=True) for k, v in w.items() if not k.endswith(".attn.bias")}
    raw = open(os.path.join(d, "data.bin"), "rb").read()
    tokens = np.frombuffer(raw[1024:], dtype=np.uint16)
    lines = dict(l.split(None, 1) for l in open(out_txt).read().splitlines() if l.startswith(("loss1", "norm1")))
    traj = [float(l.split()[2]) for l in open(out_txt).read().splitlines() if l.startswith("traj ")]

    bs = batches(tokens, world, B, T, 0)
    loss = world_loss(p, bs)
    loss.backward()
    ours = float(lines["loss1"])
    report(abs(ours - loss.item()) <= 1e-5 * abs(loss.item()),
           "loss of step 1: ours %.9f, torch %.9f (bound 1e-5 relative)" % (ours, loss.item()))
    logits = gpt2({k: v.detach() for k, v in p.items()}, bs[0][0]).numpy()
    mine = np.fromfile(os.path.join(d, "logits.f32"), dtype=np.float32).reshape(logits.shape)
    e = np.abs(mine - logits).max() / np.abs(logits).max()
    report(e <= 1e-5, "logits of rank 0's micro-batch: max error %.2e of the largest (bound 1e-5)" % e)
    norm = math.sqrt(sum(float((t.grad ** 2).sum()) for t in p.values()))
    ours = float(lines["norm1"])
    report(abs(ours - norm) <= 1e-4 * norm,
           "gradient norm: ours %.9f, torch %.9f (bound 1e-4 relative)" % (ours, norm))
    worst, count = 0.0, 0
    for name, t in sorted(p.items()):
        f = os.path.join(d, "after", "transformer." + name + ".f32")
        after = np.fromfile(f, dtype=np.float32).astype(np.float64).reshape(t.shape)
        g_ours = w[name] - after  # one AdamW step with lr = eps = 1e6 moves by -g
        g_ref = t.grad.numpy()
        e = np.abs(g_ours - g_ref).max() / max(np.abs(g_ref).max(), 1e-12)
        worst = max(worst, e)
        count += 1
        if e > 1e-4:
            report(False, "gradient of %s: max error %.2e of the largest (bound 1e-4)" % (name, e))
    report(count == 4 + 12 * L, "gradients of all %d parameters compared; worst %.2e (bound 1e-4)" % (count, worst))

    # 10 AdamW steps from the same weights, torch.optim.AdamW as the engine does it.
    p = {k: torch.tensor(v, requires_grad=True) for k, v in w.items() if not k.endswith(".attn.bias")}
    decay = [t for k, t in p.items() if k.endswith(".weight") and not k.split(".")[-2].startswith("ln")]
    no_decay = [t for k, t in p.items() if not any(t is u for u in decay)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": no_decay, "weight_decay": 0.0}], lr=1e-3, foreach=False)
    ref = []
    for s in range(len(traj)):
        opt.zero_grad()
        loss = world_loss(p, batches(tokens, world, B, T, s))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(p.values()), 1.0)
        opt.step()
        ref.append(loss.item())
    report(len(traj) == 10, "10 training steps reported (%d)" % len(traj))
    e = max(abs(a - b) / b for a, b in zip(traj, ref)) if traj else 1
    report(e <= 1e-4, "loss over 10 AdamW steps: worst relative error %.2e (bound 1e-4); "
           "ours %s, torch %s" % (e, " ".join("%.5f" % x for x in traj[::3]),
                                  " ".join("%.5f" % x for x in ref[::3])))
    report(ref[-1] < ref[0], "the loss falls (%.4f -> %.4f)" % (ref[0], ref[-1]))
    return 1 if FAILED else 0


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2])
    else:
        sys.exit(check(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]))
