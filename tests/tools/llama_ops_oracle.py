#!/usr/bin/python3
"""tests/tools/llama_ops_oracle.py -- PyTorch's answers for nn/llama_ops_cpu.c.

    llama_ops_oracle.py gen DIR             inputs (DIR/in) and references (DIR/ref)
    llama_ops_check DIR/in OUTDIR           (tests/progs/llama_ops_check.c) runs every op
    llama_ops_oracle.py compare DIR OUTDIR [CASE...]
                                            one TAP line per case and tensor; exit 1 if
                                            any is over its bound (CASE: only those cases)

gen and compare are ops_oracle_common.py's (the files, the error measure, the
"+=" lines of backward runs into prefilled buffers); here are the cases, with odd
shapes (T 1, 7, 13 and 67, head sizes 8, 16, 24, 40, 64, 96, 130, GQA ratios 1,
2, 3, 4 and 8, rms_norm_eps 1e-12 to 1e-2, rope_theta 10 to 1e9), their float32
inputs and torch's results. The values of a case line are the shapes and constants.

The reference is written here with plain torch ops, not with transformers: the
layers of HF's LlamaForCausalLM (LlamaRMSNorm, rotate_half RoPE with the "llama3"
rope scaling of _compute_llama3_parameters, LlamaMLP's silu(gate) * up, eager
attention with repeat_kv, nn.Linear without bias), run in float64 on the very
float32 inputs (upcast exactly), gradients by autograd. That is the exact result
for those inputs up to float64 rounding (~1e-16), so the error measured is the C
code's alone; torch's float32 result's error against float64 is printed next to
ours for scale.

Bounds: 1e-5 for forward outputs, 1e-4 for gradients, with floor = 1e-3 *
max|ref| over the tensor; inv_freq, whose elements span six orders of magnitude,
is judged element by element (floor 0: FLOORS). llama_ops_check's forward
outputs start as NaN, so an element left unwritten fails.
"""
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ops_oracle_common import Oracle  # noqa: E402 (after the path)

FLOORS = {"inv_freq": 0.0}  # per tensor, where FLOOR would hide the small elements
SEED = 20240623

# Llama 3.1's rope_scaling: {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
# "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}, rope_theta 500000
LLAMA3 = dict(theta=500000, scaled=1, factor=8, low=1, high=4, orig=8192)
PLAIN = dict(theta=10000, scaled=0)


# ---------------------------------------------------------------- the cases

def cases():
    out = []
    out.append(("rmsnorm", "rmsnorm", dict(N=14, C=24, eps=1e-5)))
    # one row of size ~1e-3, where mean(x^2) ~ eps = 1e-6 (eps must sit inside the sqrt)
    out.append(("rmsnorm_eps6", "rmsnorm", dict(N=13, C=72, eps=1e-6)))
    # rms_norm_eps at both ends: 1e-12 with a row of zeros and rows of ~1e-7 and
    # ~1e-20 (eps dominant, rstd ~1e6), N = 5 rows of C = 7; 1e-2 on rows of ~0.1
    out.append(("rmsnorm_eps12", "rmsnorm", dict(N=5, C=7, eps=1e-12)))
    out.append(("rmsnorm_eps2", "rmsnorm", dict(N=4, C=40, eps=1e-2)))
    # The llama3 scaling sorts the frequencies by wavelength 2 pi / inv_freq
    # against 8192 / 4 = 2048 and 8192 / 1 = 8192. With theta 500000 (Llama 3's)
    # the wavelengths at hd = 8 are 6.3, 167, 4443, 118140: two kept, one
    # interpolated, one divided by 8; at hd = 16: 6.3 .. 864 kept (4), 4443
    # interpolated, 22915 .. 609132 divided (3); hd 64 and 128 have several of
    # each. gen asserts that every scaled case has all three bands (bands()).
    out.append(("freqs_hd8", "rope_freqs", dict(hd=8, **PLAIN)))
    out.append(("freqs_hd8_llama3", "rope_freqs", dict(hd=8, **LLAMA3)))
    out.append(("freqs_hd16_llama3", "rope_freqs", dict(hd=16, **LLAMA3)))
    out.append(("freqs_hd128_llama3", "rope_freqs", dict(hd=128, **LLAMA3)))  # Llama 3.1 8B
    # rope_theta small and huge, head sizes that are no power of two: theta 10
    # at hd 24 (inv_freq 1 .. 0.15), theta 1e9 at hd 80 with factor 32 (12
    # kept, 2 interpolated, 26 divided)
    out.append(("freqs_hd24_theta10", "rope_freqs", dict(hd=24, theta=10.0, scaled=0)))
    out.append(("freqs_hd80_theta1e9_llama3", "rope_freqs",
                dict(hd=80, **dict(LLAMA3, theta=1e9, factor=32))))
    # rope cases take inv_freq as an input (torch's, rounded to f32), so they
    # check the rotation alone
    out.append(("rope_hd8", "rope", dict(B=2, T=7, NH=3, hd=8, **PLAIN)))
    out.append(("rope_llama3", "rope", dict(B=2, T=13, NH=2, hd=16, **LLAMA3)))
    # positions up to 2999: the interpolated band (inv_freq 5.2e-4) turns by 1.6
    # rad, the lowest kept one (1/137.5) by 22 rad, the divided ones by up to 0.1
    # rad, so every band's rotation is far from the identity
    out.append(("rope_long", "rope", dict(B=1, T=3000, NH=1, hd=16, **LLAMA3)))
    out.append(("rope_hd64", "rope", dict(B=1, T=5, NH=2, hd=64, **LLAMA3)))
    out.append(("rope_hd24", "rope", dict(B=3, T=5, NH=5, hd=24, theta=10.0, scaled=0)))
    out.append(("swiglu", "swiglu", dict(N=677)))
    out.append(("attn_mha", "attention", dict(B=2, T=7, NH=3, NKV=3, hd=8)))
    out.append(("attn_gqa2", "attention", dict(B=2, T=13, NH=4, NKV=2, hd=16)))
    out.append(("attn_gqa4", "attention", dict(B=1, T=13, NH=8, NKV=2, hd=8)))
    # hd 64 (one whole block of the C code's 64 head dimensions) and 96 (one and
    # a half), both with one kv head for all (multi-query)
    out.append(("attn_hd64", "attention", dict(B=1, T=5, NH=4, NKV=1, hd=64)))
    out.append(("attn_hd96", "attention", dict(B=1, T=7, NH=2, NKV=1, hd=96)))
    # scores near 1000: exp overflows even in double unless the row maximum is
    # subtracted (forward only: see FWD_ONLY)
    out.append(("attn_big", "attention", dict(B=1, T=13, NH=4, NKV=2, hd=16)))
    # one token (T = 1: its own key alone, probability 1, dq = dk = 0); groups
    # of 3 query heads (12 over 4, 9 over 3) with head sizes 24 and 40 and T 67
    # (past 64) in 3 different rows; groups of 8 at hd 130 (two blocks of 64
    # and a part of 2)
    out.append(("attn_t1", "attention", dict(B=2, T=1, NH=4, NKV=2, hd=24)))
    out.append(("attn_gqa3", "attention", dict(B=3, T=67, NH=12, NKV=4, hd=24)))
    out.append(("attn_hd40", "attention", dict(B=2, T=13, NH=9, NKV=3, hd=40)))
    out.append(("attn_hd130", "attention", dict(B=1, T=5, NH=16, NKV=2, hd=130)))
    out.append(("matmul", "matmul", dict(N=14, IC=24, OC=40)))
    # past the tiles of mm_rows (64 columns, 4 rows) and mm_dots (blocks of 64,
    # pairs of rows, 8 lanes), with partial tiles everywhere
    out.append(("matmul_big", "matmul", dict(N=21, IC=130, OC=75)))
    return out


def rope_inv_freq(s):
    """inv_freq (hd/2) in float64: HF's default theta^(-2i/hd), then (scaled)
    _compute_llama3_parameters written out."""
    import torch

    hd, theta = s["hd"], float(s["theta"])
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    if not s["scaled"]:
        return inv_freq
    factor, low, high, orig = float(s["factor"]), float(s["low"]), float(s["high"]), s["orig"]
    low_freq_wavelen = orig / low
    high_freq_wavelen = orig / high
    wavelen = 2 * math.pi / inv_freq
    # wavelen < high_freq_wavelen: kept; wavelen > low_freq_wavelen: divided by factor
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    # in between: interpolated smoothly
    smooth_factor = (orig / wavelen - low) / (high - low)
    smoothed = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_freq_llama)


def bands(s):
    """How many frequencies of a scaled case are kept, interpolated, divided."""
    inv = 1.0 / (float(s["theta"]) ** (np.arange(0, s["hd"], 2) / s["hd"]))
    wavelen = 2 * math.pi / inv
    hi, lo = s["orig"] / s["high"], s["orig"] / s["low"]
    return (int((wavelen < hi).sum()), int(((wavelen >= hi) & (wavelen <= lo)).sum()),
            int((wavelen > lo).sum()))


def gen_inputs(name, op, s, rng):
    """float32 numpy inputs of one case."""
    if s.get("scaled"):
        assert min(bands(s)) > 0, (name, "not every llama3 band occurs", bands(s))
    f32 = lambda *shape: rng.standard_normal(shape).astype(np.float32)
    if op == "rmsnorm":
        x = f32(s["N"], s["C"]) + 0.5
        if name == "rmsnorm_eps6":
            x[3] *= 1e-3
        if name == "rmsnorm_eps12":
            x[0], x[1], x[2] = 0.0, x[1] * 1e-7, x[2] * 1e-20
        if name == "rmsnorm_eps2":
            x *= 0.1
        return dict(inp=x.astype(np.float32), weight=(1 + 0.3 * f32(s["C"])).astype(np.float32),
                    dout=f32(s["N"], s["C"]))
    if op == "rope_freqs":
        return {}
    if op == "rope":
        B, T, NH, hd = s["B"], s["T"], s["NH"], s["hd"]
        return dict(inp=f32(B, T, NH, hd), inv_freq=rope_inv_freq(s).numpy().astype(np.float32),
                    dout=f32(B, T, NH, hd))
    if op == "swiglu":
        g = 3 * f32(s["N"])
        g[:8] = [-40.0, -12.0, -3.0, 0.0, 1e-4, 3.0, 12.0, 40.0]  # the tails and zero
        return dict(gate=g.astype(np.float32), up=f32(s["N"]), dout=f32(s["N"]))
    if op == "attention":
        B, T, NH, NKV, hd = s["B"], s["T"], s["NH"], s["NKV"], s["hd"]
        q, k, v = f32(B, T, NH, hd), f32(B, T, NKV, hd), f32(B, T, NKV, hd)
        if name == "attn_big":
            # every score 0.25 * 100 * 40 = 1000 plus O(1): q's dimension 0 is 100,
            # k's is 40 +- 0.04
            q[..., 0] = 100.0
            k[..., 0] = 40.0 + 0.04 * rng.standard_normal((B, T, NKV))
        return dict(q=q, k=k.astype(np.float32), v=v, dout=f32(B, T, NH, hd))
    if op == "matmul":
        return dict(inp=f32(s["N"], s["IC"]), weight=(0.5 * f32(s["OC"], s["IC"])).astype(np.float32),
                    dout=f32(s["N"], s["OC"]))
    raise ValueError(op)


def reference(op, s, x, dtype):
    """torch's outputs and gradients of one case, as numpy arrays of dtype."""
    import torch

    t = {k: torch.tensor(v.astype(np.float64), dtype=dtype) for k, v in x.items()}
    for k in ("inp", "weight", "gate", "up", "q", "k", "v"):
        if k in t:
            t[k].requires_grad_(True)
    res = {}
    if op == "rmsnorm":
        # LlamaRMSNorm
        xin = t["inp"]
        rstd = torch.rsqrt(xin.pow(2).mean(-1, keepdim=True) + s["eps"])
        out = t["weight"] * (xin * rstd)
        out.backward(t["dout"])
        res = dict(out=out, rstd=rstd.squeeze(-1), dinp=xin.grad, dweight=t["weight"].grad)
    elif op == "rope_freqs":
        res = dict(inv_freq=rope_inv_freq(s).to(dtype))
    elif op == "rope":
        # LlamaRotaryEmbedding + apply_rotary_pos_emb, positions 0..T-1
        T, hd = s["T"], s["hd"]
        xin = t["inp"]  # (B,T,NH,hd)
        xin.requires_grad_(True)
        freqs = torch.arange(T, dtype=dtype)[:, None] * t["inv_freq"][None, :]  # (T,hd/2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[None, :, None, :], emb.sin()[None, :, None, :]

        def rotate_half(a):
            a1, a2 = a[..., :hd // 2], a[..., hd // 2:]
            return torch.cat((-a2, a1), dim=-1)

        out = xin * cos + rotate_half(xin) * sin
        out.backward(t["dout"])
        res = dict(out=out, out_inplace=out, dinp=xin.grad)
    elif op == "swiglu":
        out = torch.nn.functional.silu(t["gate"]) * t["up"]
        out.backward(t["dout"])
        res = dict(out=out, dgate=t["gate"].grad, dup=t["up"].grad)
    elif op == "attention":
        # LlamaAttention's eager path: repeat_kv, scores, causal mask, softmax
        B, T, NH, NKV, hd = s["B"], s["T"], s["NH"], s["NKV"], s["hd"]
        rep = NH // NKV

        def repeat_kv(a):  # (B,NKV,T,hd) -> (B,NH,T,hd), head h reads kv head h // rep
            return a[:, :, None, :, :].expand(B, NKV, rep, T, hd).reshape(B, NH, T, hd)

        q = t["q"].transpose(1, 2)
        k = repeat_kv(t["k"].transpose(1, 2))
        v = repeat_kv(t["v"].transpose(1, 2))
        scores = q @ k.transpose(-2, -1) / math.sqrt(hd)
        above = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        scores = scores.masked_fill(above, float("-inf"))
        att = torch.softmax(scores, dim=-1)
        out = (att @ v).transpose(1, 2)  # (B,T,NH,hd)
        out.backward(t["dout"])
        res = dict(out=out, lse=torch.logsumexp(scores.detach(), dim=-1),
                   dq=t["q"].grad, dk=t["k"].grad, dv=t["v"].grad)
    elif op == "matmul":
        out = torch.nn.functional.linear(t["inp"], t["weight"])
        out.backward(t["dout"])
        res = dict(out=out, dinp=t["inp"].grad, dweight=t["weight"].grad,
                   dweight_nodinp=t["weight"].grad)  # dinp NULL: the same dweight
    npd = np.float64 if dtype == torch.float64 else np.float32
    return {k: v.detach().numpy().astype(npd) for k, v in res.items()}


# Cases whose gradients are not compared. attn_big's lse, ~1000, is stored in f32
# (as the kernels store it) to within 3e-5, so every probability the backward
# recomputes as exp(score - lse) is off by up to 3e-5 relative, and a gradient
# element that cancels to 1e-3 of its tensor's largest (the floor) is then off by
# up to ~3e-2 of itself: the resolution of the saved state, not a fault of the
# code. (At the other cases' |lse| < ~10 the same effect stays below ~3e-5; the
# stored f32 out, through D = dout . out, adds as much to dq and dk.)
FWD_ONLY = {"attn_big": ("out", "lse")}


ORACLE = Oracle(prog="llama_ops_oracle", seed=SEED, cases=cases, gen_inputs=gen_inputs,
                reference=reference, fwd_only=FWD_ONLY, floors=FLOORS)

if __name__ == "__main__":
    sys.exit(ORACLE.main(sys.argv[1:], __doc__))
