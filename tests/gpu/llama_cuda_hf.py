#!/usr/bin/env python3
"""tests/gpu/llama_cuda_hf.py — transformers' LlamaForCausalLM as the oracle of
the Llama model's CUDA path (bf16 parameters and activations, f32 masters);
run on the GPU machine by tests/gpu/test_llama.sh.

    llama_cuda_hf.py make DIR [llama_oracle.py make's options]
        an HF Llama directory as tests/tools/llama_oracle.py makes it
        (config.json, weights under LlamaForCausalLM's names, data.bin: an
        llm.c "llama-3" token shard), with every weight then rounded to bf16
        and stored as f32, so that our bf16 parameters and the reference's f32
        ones are the same numbers.
    llama_cuda_hf.py check DIR OUT WORLD B T OUT.txt [--mask K]
        compare what tests/progs/llama_check --init DIR --out OUT wrote on
        cuda ranks (OUT.txt: its stdout, "loss1", "norm1" and "traj S LOSS
        NORM" lines; OUT/logits.f32, rank 0's; OUT/after: a checkpoint after
        one AdamW step with lr = eps = 1e6, whose .optim files hold each
        parameter's f32 master "<name>.master" = p0 - g) with
        LlamaForCausalLM in f32 on the GPU (no TF32, eager attention) on the
        same weights and batches; print "ok"/"FAIL" lines with the figures;
        exit 1 on any failure.

The batches are llama_oracle.py's (llm.c's DataLoader: rank r of WORLD takes
tokens [pos + r B T, + B T + 1) of each global batch; --mask K leaves every
K-th target out, target -1); the loss is the mean over ranks of each rank's
mean over its counted targets.

Bounds (ours computes in bf16 with f32 sums; the reference in f32), as
tests/gpu/gpt2_hf.py's for GPT-2's CUDA path:
  loss of step 1        5e-3 relative
  logits                2e-2 relative (||ours - ref|| / ||ref||)
  gradient norm         2e-2 relative
  every gradient        5e-2 relative per tensor (||.|| as above)
  AdamW steps           (lr 1e-3, weight decay 0.01 except the RMSNorm weights,
                        clip 1.0, torch.optim.AdamW) each step's loss within
                        1e-2 relative, its gradient norm within 5e-2
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

DEV = "cuda" if torch.cuda.is_available() else "cpu"  # the GPU machine's; cpu: a dry run
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import llama_oracle as lo  # noqa: E402  (make, read_model, shapes, batches)

FAILED = []


def report(ok, msg):
    print(("ok   " if ok else "FAIL ") + msg, flush=True)
    if not ok:
        FAILED.append(msg)


def make(argv):
    a = argparse.Namespace(**{"layers": 2, "embd": 48, "heads": 8, "kv": 2, "head_dim": 8,
                                 "ffn": 96, "vocab": 101, "max_pos": 64, "tied": 0, "llama3": 0,
                                 "shards": 1, "theta": 10000.0})
    d = argv[0]
    it = iter(argv[1:])
    for k in it:
        name = k.lstrip("-").replace("-", "_")
        if not hasattr(a, name):
            raise SystemExit("llama_cuda_hf.py make: unknown option %s" % k)
        setattr(a, name, type(getattr(a, name))(next(it)))
    if a.shards != 1:
        raise SystemExit("llama_cuda_hf.py make: one file only (--shards 1)")
    lo.make(d, a)
    w = lo.read_model(d)
    # round to bf16 (nearest even, as the C loader converts), keep as f32
    w = {k: torch.tensor(v, dtype=torch.float32).bfloat16().float().numpy() for k, v in w.items()}
    lo.write_safetensors(os.path.join(d, "model.safetensors"), w)


def hf_model(d):
    from transformers import LlamaConfig, LlamaForCausalLM
    try:
        cfg = LlamaConfig.from_pretrained(d, attn_implementation="eager")
    except TypeError:
        cfg = LlamaConfig.from_pretrained(d)
    model = LlamaForCausalLM(cfg)
    w = lo.read_model(d)
    sd = {k: torch.tensor(v, dtype=torch.float32) for k, v in w.items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if "rotary_emb" not in k]
    tied = bool(cfg.tie_word_embeddings)
    if unexpected or missing not in ([], ["lm_head.weight"] if tied else []):
        raise SystemExit("model.safetensors does not fit LlamaForCausalLM: missing %s, "
                         "unexpected %s" % (missing, unexpected))
    if tied:
        model.tie_weights()
        if model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
            raise SystemExit("the LM head is not tied to the embedding after tie_weights()")
    return model.to(DEV).train(), w


def world_loss(model, V, bs):
    return sum(F.cross_entropy(model(input_ids=x.to(DEV)).logits.float().reshape(-1, V),
                               y.to(DEV).reshape(-1), ignore_index=-1) for x, y in bs) / len(bs)


def rel(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def masters_of(after):
    from safetensors.torch import load_file
    out = {}
    if not os.path.isdir(after):
        return out
    for f in sorted(os.listdir(after)):
        if f.endswith(".optim.safetensors"):
            for k, v in load_file(os.path.join(after, f)).items():
                if k.endswith(".master"):
                    out[k[:-len(".master")]] = v.double().numpy()
    return out


def check(d, out, world, B, T, out_txt, mask):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    cfg = json.load(open(os.path.join(d, "config.json")))
    V = cfg["vocab_size"]
    raw = open(os.path.join(d, "data.bin"), "rb").read()
    tokens = np.frombuffer(raw[1024:], dtype=np.uint32)
    text = open(out_txt).read().splitlines()
    lines = dict(l.split(None, 1) for l in text if l.startswith(("loss1", "norm1")))
    traj = [tuple(map(float, l.split()[2:4])) for l in text if l.startswith("traj ")]
    if "loss1" not in lines or "norm1" not in lines:
        report(False, "%s has no loss1 and norm1 lines" % out_txt)
        return 1

    model, w = hf_model(d)
    bs = lo.batches(tokens, world, B, T, 0, mask)
    loss = world_loss(model, V, bs)
    loss.backward()
    ours = float(lines["loss1"])
    e = abs(ours - loss.item()) / abs(loss.item())
    report(e <= 5e-3, "loss of step 1: ours %.6f, HF %.6f: relative error %.2e (bound 5e-3)"
           % (ours, loss.item(), e))
    with torch.no_grad():
        ref = model(input_ids=bs[0][0].to(DEV)).logits.double().cpu().numpy()
    mine = np.fromfile(os.path.join(out, "logits.f32"), dtype=np.float32)
    if mine.size != ref.size:
        report(False, "logits.f32 holds %d values, not %d" % (mine.size, ref.size))
    else:
        e = rel(mine.astype(np.float64).reshape(ref.shape), ref)
        report(e <= 2e-2, "logits of rank 0's micro-batch: relative error %.2e (bound 2e-2)" % e)
    grads = {k: v.grad.double().cpu().numpy() for k, v in model.named_parameters()}
    norm = math.sqrt(sum(float((g ** 2).sum()) for g in grads.values()))
    ours = float(lines["norm1"])
    e = abs(ours - norm) / norm
    report(e <= 2e-2, "gradient norm: ours %.6f, HF %.6f: relative error %.2e (bound 2e-2)"
           % (ours, norm, e))
    masters = masters_of(os.path.join(out, "after"))
    names = list(lo.shapes(cfg))
    if sorted(grads) != sorted(names):
        report(False, "HF's parameters %s are not the model's %s" % (sorted(grads), sorted(names)))
    table, bad = [], 0
    for name in names:
        if name not in masters or name not in grads:
            report(False, "no master weights for %s in %s/after" % (name, out))
            continue
        g_ref = grads[name]
        g_ours = w[name].astype(np.float64) - masters[name].reshape(g_ref.shape)  # moved by -g
        e = rel(g_ours, g_ref)
        table.append((e, name))
        if e > 5e-2:
            bad += 1
            report(False, "gradient of %s: relative error %.2e (bound 5e-2)" % (name, e))
    print("  gradient errors, worst 6: " + ", ".join("%s %.2e" % (n, e) for e, n in sorted(table)[::-1][:6]))
    want = 2 + 9 * cfg["num_hidden_layers"] + (0 if cfg["tie_word_embeddings"] else 1)
    report(len(table) == want and len(table) == len(names) and bad == 0,
           "gradients of all %d parameters compared (of %d), %d out of bounds; worst %.2e (%s; "
           "bound 5e-2)" % (len(table), want, bad, max(table)[0] if table else math.nan,
                            max(table)[1] if table else "-"))

    # The AdamW steps from the same weights, torch.optim.AdamW as the engine does it.
    model, w = hf_model(d)
    named = dict(model.named_parameters())
    decay = [t for k, t in named.items() if not k.endswith("norm.weight")]
    no_decay = [t for k, t in named.items() if k.endswith("norm.weight")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": no_decay, "weight_decay": 0.0}], lr=1e-3, foreach=False)
    ref = []
    for s in range(len(traj)):
        opt.zero_grad()
        loss = world_loss(model, V, lo.batches(tokens, world, B, T, s, mask))
        loss.backward()
        n = torch.nn.utils.clip_grad_norm_(list(named.values()), 1.0)
        opt.step()
        ref.append((loss.item(), float(n)))
    report(len(traj) >= 10, "%d training steps reported (want 10 or more)" % len(traj))
    el = max((abs(a[0] - b[0]) / b[0] for a, b in zip(traj, ref)), default=1)
    en = max((abs(a[1] - b[1]) / b[1] for a, b in zip(traj, ref)), default=1)
    report(el <= 1e-2 and en <= 5e-2,
           "loss and gradient norm over %d AdamW steps: worst relative errors %.2e (bound 1e-2), "
           "%.2e (bound 5e-2); losses ours %s, HF %s"
           % (len(traj), el, en, " ".join("%.4f" % x[0] for x in traj[::3]),
              " ".join("%.4f" % x[0] for x in ref[::3])))
    return 1 if FAILED else 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "make":
        make(sys.argv[2:])
    elif len(sys.argv) in (8, 10) and sys.argv[1] == "check":
        mask = int(sys.argv[9]) if len(sys.argv) == 10 and sys.argv[8] == "--mask" else 0
        sys.exit(check(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]),
                       int(sys.argv[6]), sys.argv[7], mask))
    else:
        sys.exit(__doc__)
