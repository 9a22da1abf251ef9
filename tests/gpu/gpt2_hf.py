#!/usr/bin/env python3
"""tests/gpu/gpt2_hf.py — HF transformers' GPT2LMHeadModel as the oracle of the
CUDA path of the C trainer (run on the GPU machine, tests/gpu/test_gpt2.sh).

    gpt2_hf.py make DIR L C NH V MAXT
        DIR/model.safetensors: a GPT2LMHeadModel (HF's initialization, then
        noise on biases and LayerNorm weights so none is 0 or 1), every weight
        rounded to bf16 and stored as f32, so that our bf16 parameters and the
        reference's f32 ones are the same numbers.
    gpt2_hf.py check DIR WORLD B T OUT.txt CURVE.txt
        compare what tests/progs/gpt2_check wrote on cuda (OUT.txt: its
        stdout; DIR/logits.f32; DIR/after/*.optim.safetensors, whose
        "<param>.master" is each parameter after one AdamW step with
        lr = eps = 1e6, i.e. p0 - g) with GPT2LMHeadModel in f32 on the GPU (no
        TF32), print "ok"/"FAIL" lines and the figures, write both loss curves
        to CURVE.txt, exit 1 on any failure.

    gpt2_hf.py pretrained STEP_DIR DATA B T LOSS [BOUND]
        transformers.GPT2LMHeadModel.from_pretrained(STEP_DIR), the directory
        exactly as the trainer wrote it (config.json, the index, one file per
        block; the optimizer's files and train_state.json beside them), with
        every warning transformers logs or raises captured: the load must
        report no missing, unexpected or mismatched key and no warning; the
        model's dtype must be the config's torch_dtype, its LM head tied to
        wte, and the config the trainer's model (gelu_new, epsilon 1e-5, ...).
        Then, in f32 on the GPU (no TF32), the mean cross-entropy of the first
        micro-batch (tokens [0, B T + 1) of DATA) against LOSS, the trainer's
        loss of its first step from the same directory: relative BOUND
        (default 5e-3, as for the loss of step 1 above).

Data: DIR/data.bin, an llm.c shard; rank r of W takes tokens
[pos + r B T, + B T + 1) of each global batch; the loss is the mean over ranks.
Bounds (ours computes in bf16 with f32 sums; the reference in f32):
  loss of step 1        5e-3 relative
  logits                2e-2 relative (||ours - ref|| / ||ref||)
  every gradient        5e-2 relative per tensor (||.|| as above)
  gradient norm         2e-2 relative
  loss curve            (AdamW lr 1e-3, weight decay 0.01 except biases and
                        LayerNorm weights, clip 1.0, as the engine does it)
                        steps 1-10 within 1e-2 relative; the median relative
                        error over all 50 steps 1e-2, over the last 10 2e-2
                        (single-step spikes land where rounding puts them:
                        see check())
"""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import GPT2Config, GPT2LMHeadModel

FAILED = []


def report(ok, msg):
    print(("ok   " if ok else "FAIL ") + msg, flush=True)
    if not ok:
        FAILED.append(msg)


def config(L, C, NH, V, MAXT):
    return GPT2Config(vocab_size=V, n_positions=MAXT, n_embd=C, n_layer=L, n_head=NH,
                      activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                      attn_pdrop=0.0, layer_norm_epsilon=1e-5, tie_word_embeddings=True)


def params_of(model):
    """HF's state without the tied head and the mask buffers: our names."""
    return {k: v for k, v in model.state_dict().items()
            if k.startswith("transformer.") and not k.endswith((".attn.bias", ".attn.masked_bias"))}


def make(d, L, C, NH, V, MAXT):
    torch.manual_seed(20241130)
    model = GPT2LMHeadModel(config(L, C, NH, V, MAXT))
    with torch.no_grad():
        for k, t in params_of(model).items():
            if k.endswith(".bias"):
                t.copy_(torch.randn_like(t) * 0.02)
            elif ".ln_" in k and k.endswith(".weight"):
                t.copy_(1 + torch.randn_like(t) * 0.1)
            t.copy_(t.bfloat16().float())
    sd = {k: v.contiguous().clone() for k, v in params_of(model).items()}
    json.dump({"L": L, "C": C, "NH": NH, "V": V, "MAXT": MAXT}, open(os.path.join(d, "shape.json"), "w"))
    save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})


def load_model(d):
    s = json.load(open(os.path.join(d, "shape.json")))
    model = GPT2LMHeadModel(config(s["L"], s["C"], s["NH"], s["V"], s["MAXT"]))
    missing, unexpected = model.load_state_dict(load_file(os.path.join(d, "model.safetensors")), strict=False)
    bad = [k for k in missing if not k.endswith((".attn.bias", ".attn.masked_bias", "lm_head.weight"))]
    if bad or unexpected:
        raise SystemExit("model.safetensors does not fit: missing %s, unexpected %s" % (bad, unexpected))
    model.tie_weights()
    return model.cuda().train(), s["V"]


def batches(tokens, world, B, T, step):
    # the trainer's reader (examples/common/data.c, as llm.c's): each step takes
    # the next world*B*T tokens, back to the start when they (and one more
    # target) would run past the end
    G, pos = world * B * T, 0
    for _ in range(step + 1):
        if pos + G + 1 > len(tokens):
            pos = 0
        here, pos = pos, pos + G
    pos = here
    out = []
    for r in range(world):
        s = tokens[pos + r * B * T: pos + r * B * T + B * T + 1].astype(np.int64)
        out.append((torch.tensor(s[:-1]).view(B, T).cuda(), torch.tensor(s[1:]).view(B, T).cuda()))
    return out


def world_loss(model, V, bs):
    return sum(F.cross_entropy(model(input_ids=x).logits.reshape(-1, V).float(), y.reshape(-1))
               for x, y in bs) / len(bs)


def rel(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def check(d, world, B, T, out_txt, curve_txt):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    raw = open(os.path.join(d, "data.bin"), "rb").read()
    tokens = np.frombuffer(raw[1024:], dtype=np.uint16)
    text = open(out_txt).read().splitlines()
    lines = dict(l.split(None, 1) for l in text if l.startswith(("loss1", "norm1")))
    traj = [float(l.split()[2]) for l in text if l.startswith("traj ")]

    model, V = load_model(d)
    p0 = {k: v.detach().double().cpu().numpy() for k, v in model.named_parameters()}
    bs = batches(tokens, world, B, T, 0)
    loss = world_loss(model, V, bs)
    loss.backward()
    ours = float(lines["loss1"])
    e = abs(ours - loss.item()) / abs(loss.item())
    report(e <= 5e-3, "loss of step 1: ours %.6f, HF %.6f: relative error %.2e (bound 5e-3)" % (ours, loss.item(), e))
    with torch.no_grad():
        ref = model(input_ids=bs[0][0]).logits.double().cpu().numpy()
    mine = np.fromfile(os.path.join(d, "logits.f32"), dtype=np.float32).astype(np.float64).reshape(ref.shape)
    e = rel(mine, ref)
    report(e <= 2e-2, "logits of rank 0's micro-batch: relative error %.2e (bound 2e-2)" % e)
    grads = {k: v.grad.double().cpu().numpy() for k, v in model.named_parameters()}
    norm = math.sqrt(sum(float((g ** 2).sum()) for g in grads.values()))
    ours = float(lines["norm1"])
    e = abs(ours - norm) / norm
    report(e <= 2e-2, "gradient norm: ours %.6f, HF %.6f: relative error %.2e (bound 2e-2)" % (ours, norm, e))
    masters = {}
    after = os.path.join(d, "after")
    for f in sorted(os.listdir(after)):
        if f.endswith(".optim.safetensors"):
            for k, v in load_file(os.path.join(after, f)).items():
                if k.endswith(".master"):
                    masters[k[:-len(".master")]] = v.double().numpy()
    worst, wname, count = 0.0, "", 0
    table = []
    for name, g_ref in sorted(grads.items()):
        if name not in masters:
            report(False, "no master weights for %s in %s" % (name, after))
            continue
        g_ours = p0[name] - masters[name].reshape(g_ref.shape)  # lr = eps = 1e6: moved by -g
        e = rel(g_ours, g_ref)
        table.append((e, name))
        count += 1
        if e > worst:
            worst, wname = e, name
        if e > 5e-2:
            report(False, "gradient of %s: relative error %.2e (bound 5e-2)" % (name, e))
    print("  gradient errors, worst 6: " + ", ".join("%s %.2e" % (n, e) for e, n in sorted(table)[::-1][:6]))
    report(count == len(grads) and count > 0,
           "gradients of all %d parameters compared; worst %.2e (%s; bound 5e-2)" % (count, worst, wname))

    # The loss curve from the same weights, torch.optim.AdamW as the engine does it.
    model, V = load_model(d)
    named = dict(model.named_parameters())
    decay = [t for k, t in named.items() if k.endswith(".weight") and not k.split(".")[-2].startswith("ln")]
    no_decay = [t for k, t in named.items() if not any(t is u for u in decay)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": no_decay, "weight_decay": 0.0}], lr=1e-3, foreach=False)
    ref = []
    for s in range(len(traj)):
        opt.zero_grad()
        loss = world_loss(model, V, batches(tokens, world, B, T, s))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(named.values()), 1.0)
        opt.step()
        ref.append(loss.item())
    with open(curve_txt, "w") as f:
        f.write("step ours hf\n")
        for s, (a, b) in enumerate(zip(traj, ref)):
            f.write("%d %.6f %.6f\n" % (s + 1, a, b))
    report(len(traj) >= 50, "%d training steps reported (want 50)" % len(traj))
    # bf16 against f32: the first steps agree closely; later the trajectory is
    # chaotic at this learning rate (bench/NOTES.md, the loss-spike entry), and
    # rounding picks where single-step spikes happen, so the later steps are
    # compared as a whole (median and a window mean), not step by step.
    errs = [abs(a - b) / b for a, b in zip(traj, ref)]
    if errs:
        e10 = max(errs[:10])
        med = float(np.median(errs))
        tail = float(np.median(errs[-10:]))
        worst = max(range(len(errs)), key=lambda i: errs[i])
        report(e10 <= 1e-2 and med <= 1e-2 and tail <= 2e-2,
               "loss curve over %d AdamW steps: steps 1-10 worst relative error %.2e (bound 1e-2), "
               "median %.2e (bound 1e-2), median of the last 10 %.2e (bound 2e-2); worst step %d "
               "(ours %.4f, HF %.4f); ours %s; HF %s"
               % (len(traj), e10, med, tail, worst + 1, traj[worst], ref[worst],
                  " ".join("%.4f" % x for x in traj[::10]), " ".join("%.4f" % x for x in ref[::10])))
    else:
        report(False, "no loss curve")
    report(bool(ref) and ref[-1] < ref[0] - 1, "the loss falls (%.4f -> %.4f)" % (ref[0], ref[-1]) if ref else "no steps")
    return 1 if FAILED else 0


def pretrained(step_dir, data, B, T, loss_ours, bound):
    """from_pretrained on a checkpoint directory as the trainer wrote it."""
    import logging
    import warnings
    from transformers.utils import logging as hf_logging

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    caught = []

    class Catch(logging.Handler):
        def emit(self, record):
            if record.levelno >= logging.WARNING:
                caught.append(record.getMessage())

    hf_logging.set_verbosity_warning()
    handler = Catch()
    hf_logging.get_logger("transformers").addHandler(handler)
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        model, info = GPT2LMHeadModel.from_pretrained(step_dir, output_loading_info=True)
    hf_logging.get_logger("transformers").removeHandler(handler)
    caught += ["%s: %s" % (w.category.__name__, w.message) for w in ws]
    bad = {k: v for k, v in info.items() if v}
    report(not bad, "from_pretrained(%s): loading info %s" % (step_dir, bad or "empty (no missing, "
                                                             "unexpected or mismatched key)"))
    report(not caught, "no warning while loading%s" % (": " + " | ".join(caught) if caught else ""))
    cfg = json.load(open(os.path.join(step_dir, "config.json")))
    c = model.config
    report(c.activation_function == "gelu_new" and abs(c.layer_norm_epsilon - 1e-5) < 1e-12
           and c.tie_word_embeddings and c.scale_attn_weights and not c.scale_attn_by_inverse_layer_idx
           and c.n_inner is None and c.resid_pdrop == 0 and c.embd_pdrop == 0 and c.attn_pdrop == 0,
           "the config is the trainer's model: L %d, H %d, C %d, V %d, maxT %d, %s, eps %g, tied, "
           "dropouts 0" % (c.n_layer, c.n_head, c.n_embd, c.vocab_size, c.n_positions,
                           c.activation_function, c.layer_norm_epsilon))
    named = cfg.get("dtype") or cfg.get("torch_dtype")
    want = getattr(torch, named) if named else None
    report(model.dtype == want, "the model's dtype %s is config.json's %s" % (model.dtype, named))
    report(model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr(),
           "the LM head is tied to wte")
    model = model.float().cuda().eval()
    raw = open(data, "rb").read()
    tokens = np.frombuffer(raw[1024:], dtype=np.uint16)[: B * T + 1].astype(np.int64)
    x = torch.tensor(tokens[:-1]).view(B, T).cuda()
    y = torch.tensor(tokens[1:]).view(B, T).cuda()
    with torch.no_grad():
        loss = F.cross_entropy(model(input_ids=x).logits.reshape(-1, c.vocab_size).float(),
                               y.reshape(-1)).item()
    e = abs(loss - loss_ours) / abs(loss)
    report(e <= bound, "loss of the first batch: the trainer %.6f, HF from the directory %.6f: "
           "relative error %.2e (bound %g)" % (loss_ours, loss, e, bound))
    return 1 if FAILED else 0


if __name__ == "__main__":
    if sys.argv[1] == "pretrained":
        sys.exit(pretrained(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]),
                            float(sys.argv[6]), float(sys.argv[7]) if len(sys.argv) > 7 else 5e-3))
    if sys.argv[1] == "make":
        make(sys.argv[2], *[int(x) for x in sys.argv[3:8]])
    else:
        sys.exit(check(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6], sys.argv[7]))
