#!/usr/bin/python3
"""tests/tools/gpt2_ops_oracle.py -- PyTorch's answers for nn/ops_cpu.c.

    gpt2_ops_oracle.py gen DIR              inputs (DIR/in) and references (DIR/ref)
    gpt2_ops_check DIR/in OUTDIR            (tests/progs/gpt2_ops_check.c) runs every op
    gpt2_ops_oracle.py compare DIR OUTDIR [CASE...]
                                            one TAP line per case and tensor; exit 1 if
                                            any is over its bound (CASE: only those cases)

gen and compare are ops_oracle_common.py's (the files, the error measure, the
"+=" lines of backward runs into prefilled buffers); here are the cases, with
odd, non-power-of-two shapes, their inputs (float32, or int32 for token ids and
targets) and torch's results.

The reference is torch in float64 on the very float32 inputs (upcast exactly):
that is the exact result for those inputs up to float64 rounding (~1e-16), so
the error measured is the C code's alone. torch's float32 result has rounding
errors of its own, as large as ours or larger (other orders of operations, f32
sums), so comparing against it would measure the sum of two errors; its error
against float64 is printed next to ours for scale.

Bounds: 1e-5 for forward outputs, 1e-4 for gradients, with floor = 1e-3 * max|ref|
over the tensor. Attention's scratch dpreatt, datt starts as NaN in gpt2_ops_check
and is overwritten, never accumulated: no "+=" lines (SCRATCH).
"""
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ops_oracle_common import Oracle  # noqa: E402 (after the path)

SEED = 20240611


# ---------------------------------------------------------------- the cases
#
# Each case: (name, op, shapes, make(rng) -> (inputs, grads-in order)). The
# reference functions take float64 torch tensors and return the outputs and,
# through autograd with the upstream gradients among the inputs, the gradients.

def cases():
    out = []
    B, T, C, NH, V = 2, 7, 12, 3, 37
    out.append(("encoder", "encoder", dict(B=B, T=T, C=C, V=V, maxT=T + 3)))
    out.append(("layernorm", "layernorm", dict(N=B * T, C=C)))
    out.append(("matmul_wt0", "matmul", dict(N=B * T, IC=C, OC=3 * C, wt=0, bias=1)))
    out.append(("matmul_wt1", "matmul", dict(N=B * T, IC=C, OC=3 * C, wt=1, bias=1)))
    # the tied LM head: wte (V,C), no bias (dbias NULL)
    out.append(("matmul_head", "matmul", dict(N=B * T, IC=C, OC=V, wt=1, bias=0)))
    # shapes past the tiles of mm_rows (64 columns, 4 rows) and mm_dots (blocks of
    # 64, pairs of rows, 8 lanes), with partial tiles everywhere
    out.append(("matmul_big_wt0", "matmul", dict(N=21, IC=70, OC=150, wt=0, bias=1)))
    out.append(("matmul_big_wt1", "matmul", dict(N=21, IC=130, OC=75, wt=1, bias=1)))
    out.append(("attention", "attention", dict(B=B, T=T, C=C, NH=NH)))
    # scores near 96: expf without subtracting the row maximum overflows
    out.append(("attention_big", "attention", dict(B=B, T=T, C=C, NH=NH)))
    out.append(("gelu", "gelu", dict(N=677)))
    out.append(("residual", "residual", dict(N=677)))
    out.append(("crossentropy", "crossentropy", dict(B=B, T=T, V=V)))
    # the smallest vocabularies: V = 1 (probability 1, loss and gradient 0) and
    # V = 2 with a row whose targets are all ignored, logits at -1e30 and +-1e4
    out.append(("crossentropy_v1", "crossentropy", dict(B=2, T=3, V=1)))
    out.append(("crossentropy_v2", "crossentropy", dict(B=2, T=4, V=2)))
    return out


def gen_inputs(name, op, s, rng):
    """float32 / int32 numpy inputs of one case."""
    f32 = lambda *shape: rng.standard_normal(shape).astype(np.float32)
    if op == "encoder":
        inp = rng.integers(0, s["V"], (s["B"], s["T"])).astype(np.int32)
        inp[0, 5] = inp[0, 2]  # a token repeated, in a row and across the batch:
        inp[1, 4] = inp[0, 2]  # dwte must sum its positions
        return dict(inp=inp, wte=f32(s["V"], s["C"]), wpe=f32(s["maxT"], s["C"]),
                    dout=f32(s["B"], s["T"], s["C"]))
    if op == "layernorm":
        return dict(inp=(2 * f32(s["N"], s["C"]) + 3), weight=f32(s["C"]), bias=f32(s["C"]),
                    dout=f32(s["N"], s["C"]))
    if op == "matmul":
        wshape = (s["OC"], s["IC"]) if s["wt"] else (s["IC"], s["OC"])
        d = dict(inp=f32(s["N"], s["IC"]), weight=(0.5 * f32(*wshape)).astype(np.float32),
                 dout=f32(s["N"], s["OC"]))
        if s["bias"]:
            d["bias"] = f32(s["OC"])
        return d
    if op == "attention":
        B, T, C, NH = s["B"], s["T"], s["C"], s["NH"]
        qkv = f32(B, T, 3 * C)
        if name == "attention_big":
            # multiples of 1/8, so every score (hs = 4, scale 1/2) is exact in
            # float32 and the test sees only the softmax's own error; head 1 of
            # batch 1 gets q.k = 32 * 6 + O(1): scores 96 +- a few. (The gradient
            # of q along that shared key component is 0, computed as 0.5 * 6 *
            # sum(dpreatt): rounding noise of f32 att times 3, about 1e-5 of the
            # floor here; a larger key component scales it up.)
            qkv = np.clip(np.round(qkv * 8) / 8, -2, 2).astype(np.float32)
            hs = C // NH
            qkv[1, :, 1 * hs] = 32.0
            qkv[1, :, C + 1 * hs] = 6.0
        return dict(qkv=qkv, dout=f32(B, T, C))
    if op == "gelu":
        x = 3 * f32(s["N"])
        x[:7] = [-12.0, -6.0, -3.0, 0.0, 1e-4, 6.0, 12.0]  # the tails and zero
        return dict(inp=x.astype(np.float32), dout=f32(s["N"]))
    if op == "residual":
        return dict(a=f32(s["N"]), b=f32(s["N"]))
    if op == "crossentropy" and name != "crossentropy":
        B, T, V = s["B"], s["T"], s["V"]
        logits = 3 * f32(B, T, V)
        targets = rng.integers(0, V, (B, T)).astype(np.int32)
        if V == 2:
            targets[0] = -1  # a whole row ignored
            logits[1, 0] = -1e30  # both: probabilities 1/2, loss log 2
            logits[1, 1] = [1e4, -1e4]  # expf(1e4) overflows unless the maximum is
            targets[1, 1] = 0  # subtracted; probabilities exactly 1 and 0, loss 0
            logits[1, 2, 0] = -1e30  # probability 0 beside a finite logit, the target
            targets[1, 2] = 1
        count = int((targets >= 0).sum())
        return dict(logits=logits.astype(np.float32), targets=targets,
                    dloss=np.array([1.0 / count], dtype=np.float32))
    if op == "crossentropy":
        B, T, V = s["B"], s["T"], s["V"]
        logits = 3 * f32(B, T, V)
        targets = rng.integers(0, V, (B, T)).astype(np.int32)
        targets[0, 3] = -1  # ignored: loss 0, no gradient
        logits[1, 2] += 1000.0  # expf overflows unless the maximum is subtracted
        # the target's probability, e^-110 or less, underflows to 0 in float32:
        # the loss must not be -log(prob) (inf)
        logits[1, 5, targets[1, 5]] = -110.0
        count = int((targets >= 0).sum())
        return dict(logits=logits.astype(np.float32), targets=targets,
                    dloss=np.array([1.0 / count], dtype=np.float32))
    raise ValueError(op)


def reference(op, s, x, dtype):
    """torch's outputs and gradients of one case, as numpy arrays of dtype."""
    import torch
    import torch.nn.functional as F

    t = {k: torch.tensor(v.astype(np.float64) if v.dtype == np.float32 else v.astype(np.int64),
                         dtype=dtype if v.dtype == np.float32 else torch.int64)
         for k, v in x.items()}
    params = [k for k in ("wte", "wpe", "inp", "weight", "bias", "qkv", "a", "b", "logits")
              if k in t and t[k].is_floating_point()]
    for k in params:
        t[k].requires_grad_(True)
    res = {}
    if op == "encoder":
        T = s["T"]
        out = t["wte"][t["inp"]] + t["wpe"][:T]
        out.backward(t["dout"])
        res = dict(out=out, dwte=t["wte"].grad, dwpe=t["wpe"].grad)
    elif op == "layernorm":
        xin = t["inp"]
        out = F.layer_norm(xin, (s["C"],), t["weight"], t["bias"], eps=1e-5)
        out.backward(t["dout"])
        xd = xin.detach()
        res = dict(out=out, mean=xd.mean(-1),
                   rstd=1.0 / torch.sqrt(xd.var(-1, unbiased=False) + 1e-5),
                   dinp=xin.grad, dweight=t["weight"].grad, dbias=t["bias"].grad)
    elif op == "matmul":
        w = t["weight"].t() if s["wt"] else t["weight"]  # as (IC,OC)
        out = t["inp"] @ w
        if s["bias"]:
            out = out + t["bias"]
        out.backward(t["dout"])
        res = dict(out=out, dinp=t["inp"].grad, dweight=t["weight"].grad)
        if s["bias"]:
            res["dbias"] = t["bias"].grad
        else:
            res["dweight_nodinp"] = t["weight"].grad  # dinp NULL: the same dweight
    elif op == "attention":
        # as transformers' GPT2Attention (_attn), with the saved tensors exposed
        B, T, C, NH = s["B"], s["T"], s["C"], s["NH"]
        hs = C // NH
        q, k, v = t["qkv"].split(C, dim=2)
        q, k, v = (a.view(B, T, NH, hs).transpose(1, 2) for a in (q, k, v))  # (B,NH,T,hs)
        preatt = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        preatt.retain_grad()
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
        att = torch.softmax(preatt.masked_fill(~causal, float("-inf")), dim=-1)
        att.retain_grad()
        out = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        out.backward(t["dout"])
        # ours are defined 0 above the diagonal (torch's datt there is dout . v,
        # the gradient of a weight that is always 0)
        res = dict(out=out, preatt=preatt.detach().masked_fill(~causal, 0.0), att=att,
                   dqkv=t["qkv"].grad, dpreatt=preatt.grad,
                   datt=att.grad.masked_fill(~causal, 0.0))
    elif op == "gelu":
        xin = t["inp"]
        # transformers' NewGELUActivation ("gelu_new")
        out = 0.5 * xin * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi)
                                            * (xin + 0.044715 * torch.pow(xin, 3.0))))
        out.backward(t["dout"])
        res = dict(out=out, dinp=xin.grad)
    elif op == "residual":
        out = t["a"] + t["b"]
        res = dict(out=out, out_in_a=out, out_in_b=out)  # in place: out is a, out is b
    elif op == "crossentropy":
        B, T, V = s["B"], s["T"], s["V"]
        logits = t["logits"]
        losses = F.cross_entropy(logits.view(-1, V), t["targets"].view(-1), ignore_index=-1,
                                 reduction="none").view(B, T)
        (losses.sum() * t["dloss"][0]).backward()
        res = dict(losses=losses, probs=torch.softmax(logits, dim=-1), dlogits=logits.grad)
    npd = np.float64 if dtype == torch.float64 else np.float32
    return {k: v.detach().numpy().astype(npd) for k, v in res.items()}


# attention's dpreatt, datt: scratch the backward overwrites, never accumulates
SCRATCH = ("dpreatt", "datt")

ORACLE = Oracle(prog="gpt2_ops_oracle", seed=SEED, cases=cases, gen_inputs=gen_inputs,
                reference=reference, in_dtypes=(np.float32, np.int32), scratch=SCRATCH)

if __name__ == "__main__":
    sys.exit(ORACLE.main(sys.argv[1:], __doc__))
