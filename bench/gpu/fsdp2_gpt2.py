#!/usr/bin/env python3
"""bench/gpu/fsdp2_gpt2.py — the peer of bench/gpu/gpt2.sh: GPT-2 in plain
PyTorch, trained with FSDP2 (fully_shard on each block and on the root).

    python3 -m torch.distributed.run --nproc_per_node P fsdp2_gpt2.py \
        --model d12|d48 -b B -t T --steps N [--ckpt] [--groups G]

Same model as examples/gpt2 (HF GPT-2: pre-LayerNorm, GELU tanh, tied head,
bias everywhere), bf16 parameters for compute with fp32 gradient reduction
(MixedPrecisionPolicy), fused AdamW (lr 3e-4, weight decay 0.1 on 2-D weights),
F.scaled_dot_product_attention(is_causal=True), optional activation
checkpointing per block. --groups G > 1 is HSDP: a 2-D mesh (G replicas x
P/G shards). Random tokens (the data path is not what is measured). Prints one
line "RESULT ..." on rank 0: median step ms over the last N - 3 steps, tokens/s
of the job, peak allocated GPU memory per rank (torch.cuda.max_memory_allocated) and
the most its caching allocator held from the device (max_memory_reserved).
"""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.checkpoint import checkpoint

CONFIGS = {"d12": (12, 12, 768), "d24": (24, 16, 1024), "d36": (36, 20, 1280), "d48": (48, 25, 1600)}
V, MAXT = 50257, 1024


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, NH, C, ckpt):
        super().__init__()
        self.ckpt = ckpt
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(MAXT, C)
        self.h = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        for n, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / (2 * L) ** 0.5 if n.endswith(("c_proj.weight", "mlp_proj.weight")) else 0.02
                nn.init.normal_(p, 0, std)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.h:
            x = checkpoint(b, x, use_reentrant=False) if self.ckpt else b(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.float().reshape(-1, V), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="d12")
    ap.add_argument("-b", type=int, default=16)
    ap.add_argument("-t", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=13)
    ap.add_argument("--ckpt", action="store_true")
    ap.add_argument("--groups", type=int, default=1)
    a = ap.parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    torch.manual_seed(1234)
    L, NH, C = CONFIGS[a.model]
    model = GPT(L, NH, C, a.ckpt).cuda()
    if a.groups > 1:
        mesh = init_device_mesh("cuda", (a.groups, world // a.groups), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh("cuda", (world,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for b in model.h:
        fully_shard(b, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=3e-4, fused=True)
    g = torch.Generator(device="cuda").manual_seed(rank)
    times = []
    for s in range(a.steps):
        idx = torch.randint(0, V, (a.b, a.t + 1), device="cuda", generator=g)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = model(idx[:, :-1], idx[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        if s == 2:
            torch.cuda.reset_peak_memory_stats()
    ms = statistics.median(times[3:]) * 1e3
    mem = torch.tensor([torch.cuda.max_memory_allocated() / 2**30,
                        torch.cuda.max_memory_reserved() / 2**30], device="cuda")
    dist.all_reduce(mem, op=dist.ReduceOp.MAX)
    if rank == 0:
        tok = a.b * a.t * world / (ms / 1e3)
        print("steps_ms " + " ".join("%.1f" % (t * 1e3) for t in times), flush=True)
        print("RESULT impl=fsdp2%s model=%s layout=%dx%d b=%d t=%d step_ms=%.1f tok_s=%.0f mem_gib=%.2f "
              "held_gib=%.2f loss=%.3f"
              % ("+ckpt" if a.ckpt else "", a.model, a.groups, world // a.groups, a.b, a.t, ms, tok,
                 mem[0].item(), mem[1].item(), loss.item()), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
