#!/usr/bin/env python3
"""tests/gpu/generate_hf.py — transformers' greedy generate() against bin/generate's.

    generate_hf.py STEP_DIR PROMPT_IDS N OUR_IDS [OUR_DUMP BOUND]

Loads STEP_DIR (an HF model directory: a trainer's step directory) with
AutoModelForCausalLM.from_pretrained(STEP_DIR, torch_dtype=torch.float32) on
the CPU and runs generate(ids, do_sample=False, max_new_tokens=N) from the
comma-separated PROMPT_IDS; it stops earlier at an end-of-sequence id of
STEP_DIR/generation_config.json, or of config.json when there is none (printed). Prints HF's ids and ours (OUR_IDS, comma
separated), then, with one forward over the prompt and HF's ids, the gap
between the two largest logits at each of HF's steps (the smallest, and where
it is). At the first difference it prints the step, both ids, HF's gap there
and HF's logits of both tokens. With OUR_DUMP (generate --dump-logits: N rows
of V f32, along our path) and BOUND: our logits against HF's along our path
(HF teacher-forced on our ids), the largest error relative to each row's
largest |logit|, which must be within BOUND.

Without OUR_DUMP the ids must equal HF's token for token (an f32 path: the
gaps are far above f32's rounding). With it, our path may leave HF's at one
step only where HF's two largest logits there lie within twice the largest
absolute error our logits showed on any row (a near-tie that our measured
error can flip, which bf16 may); anywhere else a difference fails, as does
any row beyond BOUND. Exits 0 or 1.
"""
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM


def main(argv):
    step, prompt, n = argv[1], [int(x) for x in argv[2].split(",")], int(argv[3])
    ours = [int(x) for x in argv[4].split(",")]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(step, torch_dtype=torch.float32)
    model.eval()
    x = torch.tensor([prompt], dtype=torch.long)
    with torch.no_grad():
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                             max_new_tokens=n, min_new_tokens=0, pad_token_id=0)
        hf = out[0, len(prompt):].tolist()
        z = model(out[:, :-1]).logits[0, len(prompt) - 1:].double().numpy()  # HF's steps
    top = np.sort(z, axis=1)[:, -2:]
    gaps = top[:, 1] - top[:, 0]
    print("HF's eos_token_id (its generation_config):", model.generation_config.eos_token_id)
    print("hf:   ", " ".join(map(str, hf)))
    print("ours: ", " ".join(map(str, ours)))
    s = int(np.argmin(gaps))
    print("HF's gaps between its two largest logits: smallest %.4g at new token %d (of %d)"
          % (gaps[s], s, len(gaps)))
    bad = None
    if ours != hf:
        bad = next(i for i in range(max(len(ours), len(hf))) if ours[i:i + 1] != hf[i:i + 1])
        a, b = ours[bad:bad + 1], hf[bad:bad + 1]
        print("first difference at new token %d: ours %s, HF %s; HF's gap there %.4g%s" % (
            bad, a, b, gaps[bad] if bad < len(gaps) else float("nan"),
            "; HF's logits of ours %.4f, of its own %.4f" % (z[bad, a[0]], z[bad, b[0]])
            if a and b and bad < len(z) else ""))
    if len(argv) <= 6:
        return 0 if bad is None else 1
    dump, bound = argv[5], float(argv[6])
    if len(ours) != n:
        print("%d ids of ours, not %d" % (len(ours), n))
        return 1
    with torch.no_grad():
        seq = torch.tensor([prompt + ours[:-1]], dtype=torch.long)
        ref = model(seq).logits[0, len(prompt) - 1:].double().numpy()
    mine = np.fromfile(dump, dtype=np.float32).astype(np.float64)
    if mine.size != ref.size:
        print("%s holds %d logits, not %d" % (dump, mine.size, ref.size))
        return 1
    err = np.abs(mine.reshape(ref.shape) - ref)
    rows = err.max(1) / np.abs(ref).max(1)
    print("our logits along our path against HF's: largest error %.2e of a row's largest "
          "(mean %.2e), bound %g; largest absolute error %.4g" % (rows.max(), rows.mean(), bound,
                                                                 err.max()))
    good = rows.max() <= bound
    picked = mine.reshape(ref.shape).argmax(1)
    if list(picked) != ours:
        print("our ids are not the largest of our own dumped logits (first at new token %d)" %
              next(i for i in range(n) if picked[i] != ours[i]))
        good = False
    if bad is not None:
        tie = bad < len(gaps) and gaps[bad] <= 2 * err.max()
        print("the difference is %s: HF's gap %.4g %s twice our largest absolute error %.4g" % (
            "a near-tie that bf16 may flip" if tie else "NOT a near-tie", gaps[bad] if bad < len(
                gaps) else float("nan"), "<=" if tie else ">", 2 * err.max()))
        good = good and tie
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
