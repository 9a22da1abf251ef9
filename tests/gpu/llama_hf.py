#!/usr/bin/env python3
"""tests/gpu/llama_hf.py — a Llama checkpoint of bmt's trainer, as HF sees it.

    llama_hf.py STEP_DIR VAL_SHARD B T WORLD WANT_VAL_LOSS [TIED]

Loads STEP_DIR (a step directory of `llama --save-dir`) with transformers'
LlamaForCausalLM.from_pretrained, unchanged, on the CPU in float32, and takes
the validation loss the trainer printed for its first global batch of
VAL_SHARD (llm.c's shard layout, world x B x T tokens: rank r's B x T inputs
and their next tokens, --eval-batches 1), the mean of the ranks' means.
Prints one line per check and exits 1 on the first that fails:
  - from_pretrained reports no missing, unexpected or mismatched weights;
  - the model's parameter count equals what the checkpoint's safetensors hold;
  - tie_word_embeddings as expected (TIED: 1 or 0);
  - HF's loss equals the trainer's printed one (4 decimals) within 1e-4.
"""
import json
import os
import sys

import numpy as np
import torch
from transformers import LlamaForCausalLM


def main(argv):
    step, shard, B, T, W, want = argv[1], argv[2], int(argv[3]), int(argv[4]), int(argv[5]), float(argv[6])
    tied = argv[7] == "1" if len(argv) > 7 else None
    torch.manual_seed(0)
    model, info = LlamaForCausalLM.from_pretrained(step, torch_dtype=torch.float32,
                                                   output_loading_info=True)
    model.eval()
    bad = {k: v for k, v in info.items() if v}
    print("loading info:", bad or "clean")
    if bad:
        return 1
    index = json.load(open(os.path.join(step, "model.safetensors.index.json")))
    names = sorted(index["weight_map"])
    hf_names = sorted(n for n, _ in model.named_parameters())
    if tied is not None:
        print("tie_word_embeddings:", model.config.tie_word_embeddings, "want", tied)
        if model.config.tie_word_embeddings != tied:
            return 1
    if not tied and names != hf_names:
        print("names differ:", set(names) ^ set(hf_names))
        return 1
    if tied and sorted(set(hf_names) - {"lm_head.weight"}) != names:
        print("names differ (tied):", set(names) ^ set(hf_names))
        return 1
    print("parameters:", model.num_parameters(), "in", len(names), "tensors, as the index lists")
    raw = np.fromfile(shard, dtype="<i4", count=256)
    width = 2 if raw[0] == 20240520 else 4
    toks = np.fromfile(shard, dtype="<u2" if width == 2 else "<u4", offset=1024).astype(np.int64)
    losses = []
    with torch.no_grad():
        for r in range(W):
            seg = torch.from_numpy(toks[r * B * T: r * B * T + B * T + 1])
            x, y = seg[:-1].view(B, T), seg[1:].view(B, T)
            logits = model(x).logits.float()
            losses.append(torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)),
                                                            y.reshape(-1)).item())
    got = sum(losses) / len(losses)
    print("HF loss %.6f, the trainer printed %.4f" % (got, want))
    return 0 if abs(got - want) <= 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
