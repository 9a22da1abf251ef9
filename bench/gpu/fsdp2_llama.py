#!/usr/bin/env python3
"""bench/gpu/fsdp2_llama.py — the peer of bench/gpu/llama.sh: a Llama in plain
PyTorch, trained with FSDP2 (fully_shard on each layer and on the root) and
torch.compile.

    python3 -m torch.distributed.run --nproc_per_node P fsdp2_llama.py \
        --model llama3.2-1b|llama3.2-3b -b B -t T --steps N [--ckpt] [--groups G] [--no-compile]

The model is HF's LlamaForCausalLM written out: RMSNorm (F.rms_norm), RoPE in
the rotate_half layout with Llama 3's frequency scaling, SwiGLU MLP,
F.scaled_dot_product_attention(is_causal=True, enable_gqa=True) (grouped-query
attention without repeating K and V), no biases, the embedding tied to the
head as the 3.2 models have it. bf16 parameters for compute with fp32
gradient reduction (MixedPrecisionPolicy), fused AdamW (lr 3e-4, weight decay
0.1 on 2-D weights), optional activation checkpointing per layer, each layer
compiled (torch.compile, the default mode) before it is sharded. --groups G > 1
is HSDP: a 2-D mesh (G replicas x P/G shards). Random tokens. Prints one line
"RESULT ..." on rank 0: median step ms over the last N - 3 steps, tokens/s of
the job, peak allocated GPU memory per rank (max_memory_allocated) and the
most its caching allocator held (max_memory_reserved).
"""
import argparse
import math
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

# L, C, NH, NKV, F, V (head size C / NH), as HF's config.json of each model
CONFIGS = {
    "llama3.2-1b": (16, 2048, 32, 8, 8192, 128256),
    "llama3.2-3b": (28, 3072, 24, 8, 8192, 128256),
}
THETA, EPS = 500000.0, 1e-5
SCALING = (32.0, 1.0, 4.0, 8192)  # factor, low_freq_factor, high_freq_factor, original max positions


def inv_freq(hd):
    f = 1.0 / (THETA ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    factor, lo, hi, orig = SCALING
    wl = 2 * math.pi / f
    smooth = (orig / wl - lo) / (hi - lo)
    mid = (1 - smooth) * f / factor + smooth * f
    f = torch.where(wl > orig / lo, f / factor, torch.where(wl < orig / hi, f, mid))
    return f.float()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Layer(nn.Module):
    def __init__(self, C, NH, NKV, FF):
        super().__init__()
        self.NH, self.NKV, self.hd = NH, NKV, C // NH
        self.input_layernorm = nn.Parameter(torch.ones(C))
        self.post_attention_layernorm = nn.Parameter(torch.ones(C))
        self.q_proj = nn.Linear(C, NH * self.hd, bias=False)
        self.k_proj = nn.Linear(C, NKV * self.hd, bias=False)
        self.v_proj = nn.Linear(C, NKV * self.hd, bias=False)
        self.o_proj = nn.Linear(NH * self.hd, C, bias=False)
        self.gate_proj = nn.Linear(C, FF, bias=False)
        self.up_proj = nn.Linear(C, FF, bias=False)
        self.down_proj = nn.Linear(FF, C, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        h = F.rms_norm(x, (C,), self.input_layernorm, EPS)
        q = self.q_proj(h).view(B, T, self.NH, self.hd).transpose(1, 2)
        k = self.k_proj(h).view(B, T, self.NKV, self.hd).transpose(1, 2)
        v = self.v_proj(h).view(B, T, self.NKV, self.hd).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o_proj(y.transpose(1, 2).reshape(B, T, C))
        h = F.rms_norm(x, (C,), self.post_attention_layernorm, EPS)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, L, C, NH, NKV, FF, V, ckpt):
        super().__init__()
        self.ckpt, self.V = ckpt, V
        self.embed_tokens = nn.Embedding(V, C)
        self.layers = nn.ModuleList(Layer(C, NH, NKV, FF) for _ in range(L))
        self.norm = nn.Parameter(torch.ones(C))
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0, 0.02)
        self.register_buffer("inv_freq", inv_freq(C // NH), persistent=False)

    def forward(self, idx, targets):
        T = idx.shape[1]
        ang = torch.outer(torch.arange(T, device=idx.device, dtype=torch.float32), self.inv_freq)
        ang = torch.cat((ang, ang), dim=-1)
        cos, sin = ang.cos().to(torch.bfloat16), ang.sin().to(torch.bfloat16)
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = checkpoint(layer, x, cos, sin, use_reentrant=False) if self.ckpt else layer(x, cos, sin)
        x = F.rms_norm(x, (x.shape[-1],), self.norm, EPS)
        logits = F.linear(x, self.embed_tokens.weight)
        return F.cross_entropy(logits.float().reshape(-1, self.V), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama3.2-1b", choices=sorted(CONFIGS))
    ap.add_argument("-b", type=int, default=2)
    ap.add_argument("-t", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=13)
    ap.add_argument("--ckpt", action="store_true")
    ap.add_argument("--groups", type=int, default=1)
    ap.add_argument("--no-compile", action="store_true")
    a = ap.parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    torch.manual_seed(1234)
    L, C, NH, NKV, FF, V = CONFIGS[a.model]
    model = Llama(L, C, NH, NKV, FF, V, a.ckpt).cuda()
    if a.groups > 1:
        mesh = init_device_mesh("cuda", (a.groups, world // a.groups), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh("cuda", (world,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers:
        if not a.no_compile:
            layer.compile()
        fully_shard(layer, mesh=mesh, mp_policy=mp)
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
        print("RESULT impl=fsdp2%s%s model=%s layout=%dx%d b=%d t=%d step_ms=%.1f tok_s=%.0f mem_gib=%.2f "
              "held_gib=%.2f loss=%.3f"
              % ("+compile" if not a.no_compile else "", "+ckpt" if a.ckpt else "", a.model, a.groups,
                 world // a.groups, a.b, a.t, ms, tok, mem[0].item(), mem[1].item(), loss.item()), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
