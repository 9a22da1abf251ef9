#!/usr/bin/env python3
"""examples/torch/train.py — a small GPT-2 in plain PyTorch under bmlaunch.

    bmlaunch -g 2 -n 2 --device cpu -- python3 examples/torch/train.py --steps 40
    bmlaunch -g 2 -n 4 --device cuda -- python3 examples/torch/train.py --layers 12 --embd 768

The same script on CPU (gloo) and on GPUs (nccl). On GPUs, where torch has
fully_shard and DeviceMesh (torch >= 2.4), every block and the model are
sharded with fully_shard on bmt's 2-D mesh: HSDP, parameters sharded within a
group and gradients all-reduced across groups. On CPUs, and on older torch
(Debian's 1.13), it trains data parallel with the same two levels by hand:
gradients all-reduced in the group, then across groups
(bmt.torch.process_groups()).

Data: the bytes of a text file (vocabulary 256), by default the corpus that
ships with the C trainer (examples/gpt2/data/corpus.txt); each rank reads its
own random windows. Each step is reported through bmt.report_step (tokens/s
and MFU on bmlaunch's /metrics and live page); SIGUSR1 saves a checkpoint at
the next step boundary on every rank and exits 0 (bmt.Preemption).
"""

import argparse
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

try:
    import bmt
except ImportError:  # the source tree's, when neither installed nor on PYTHONPATH
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                    "python"))
    import bmt
import bmt.torch

HERE = os.path.dirname(os.path.abspath(__file__))


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=os.path.join(HERE, "..", "gpt2", "data", "corpus.txt"))
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--embd", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--save-dir", help="checkpoints: at the end and on SIGUSR1 (then exit 0)")
    p.add_argument("--resume", action="store_true",
                   help="continue from SAVE_DIR/latest (also when BMT_RESTART > 0)")
    p.add_argument("--pace", type=float, default=0, help="sleep this many ms per step (tests)")
    p.add_argument("--no-shard", action="store_true",
                   help="hierarchical data parallel even where fully_shard exists")
    return p.parse_args()


class Block(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.fc, self.out = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        if hasattr(F, "scaled_dot_product_attention"):  # torch >= 2.0
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            y = att.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, seq, layers, c, heads):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, c), nn.Embedding(seq, c)
        self.blocks = nn.ModuleList(Block(c, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(c)
        self.head = nn.Linear(c, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied, as GPT-2
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers) if name.endswith(
                    ("proj.weight", "out.weight")) else 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def find_fully_shard():
    for mod in ("torch.distributed.fsdp", "torch.distributed._composable.fsdp"):
        try:
            m = __import__(mod, fromlist=["fully_shard"])
            if hasattr(m, "fully_shard"):
                return m.fully_shard
        except Exception:  # absent, or broken: Debian's 1.13 on Python 3.11 fails to import it
            pass
    return None


def check_groups(pg, device):
    """Each process group all-reduces to the sum of its members' ranks."""
    lay = pg.layout
    for name, group, members in (("group", pg.group, lay.group_members()),
                                 ("replica", pg.replica, lay.replica_members())):
        t = torch.tensor([float(lay.rank)], device=device)
        dist.all_reduce(t, group=group)
        if t.item() != sum(members):
            raise SystemExit("train.py: rank %d: the %s process group summed %g, its members %s "
                             "sum to %d" % (lay.rank, name, t.item(), members, sum(members)))
    print("train.py: rank %d: process groups ok: group %d %s, replica %d %s"
          % (lay.rank, lay.group, lay.group_members(), lay.replica, lay.replica_members()),
          flush=True)


def main():
    a = parse()
    lay = bmt.torch.init_process_group()
    rank, world = lay.rank, lay.world
    device = torch.device("cuda", lay.local_rank) if bmt.torch.device_type() == "cuda" else \
        torch.device("cpu")
    if device.type == "cpu":
        torch.set_num_threads(1)  # ranks share the machine's cores
    pg = bmt.torch.process_groups()
    check_groups(pg, device)

    data = torch.frombuffer(bytearray(open(a.data, "rb").read()), dtype=torch.uint8).long()
    torch.manual_seed(a.seed)  # the same initial weights on every rank
    model = GPT(256, a.seq, a.layers, a.embd, a.heads)
    params = sum(p.numel() for p in model.parameters())
    model.to(device)

    # The 2-D mesh where torch has it; fully_shard on it on GPUs. On CPUs (gloo)
    # the same two levels by hand, over the group and replica process groups.
    fully_shard, mesh, mode = None, None, "hierarchical data parallel (bmt.torch.process_groups)"
    try:
        mesh = bmt.torch.device_mesh()
        if rank == 0:
            print("train.py: %r" % (mesh,), flush=True)
    except RuntimeError as e:
        if rank == 0:
            print("train.py: %s" % e, flush=True)
    if mesh is not None and device.type == "cuda" and not a.no_shard:
        fully_shard = find_fully_shard()
    if fully_shard is not None:
        for b in model.blocks:
            fully_shard(b, mesh=mesh)
        fully_shard(model, mesh=mesh)
        mode = "fully_shard on the %d x %d mesh %s (HSDP)" % (lay.groups, lay.gpus_per_group,
                                                             bmt.torch.MESH_DIMS)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / a.warmup))

    sharded = fully_shard is not None
    first = 1
    latest = os.path.join(a.save_dir, "latest") if a.save_dir else None
    if latest and (a.resume or lay.restart > 0) and os.path.exists(latest):
        first = load(model, opt, sched, a.save_dir, sharded)
        bmt.report_event("restart", "resumed from step %d" % (first - 1))
        if rank == 0:
            print("train.py: resumed from %s at step %d" % (latest, first), flush=True)
    if first > a.steps and rank == 0:  # as the C trainers: the checkpoint stays the latest
        print("train.py: the checkpoint is at step %d and --steps is %d: nothing left to train "
              "(raise --steps to go on)" % (first - 1, a.steps), flush=True)

    def save(step):
        return save_checkpoint(model, opt, sched, a.save_dir, step, rank, sharded)

    if rank == 0:
        print("train.py: torch %s | %d params (%d layers, C %d) | layout %d x %d = %d ranks | %s"
              % (torch.__version__, params, a.layers, a.embd, lay.groups, lay.gpus_per_group,
                 world, mode), flush=True)
    tokens = a.batch * a.seq
    flops = 6.0 * params * tokens
    gen = torch.Generator().manual_seed(a.seed * 1000 + rank)
    with bmt.Preemption(save=save if a.save_dir else None) as pre:
        bmt.step_begin()
        for step in range(first, a.steps + 1):
            gen.manual_seed(a.seed * 1000003 + step * 1009 + rank)
            start = torch.randint(0, data.numel() - a.seq - 1, (a.batch,), generator=gen)
            chunk = torch.stack([data[s:s + a.seq + 1] for s in start.tolist()]).to(device)
            loss = model(chunk[:, :-1], chunk[:, 1:])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if not sharded:  # two levels, as libbmt: within the group, then across groups
                grads = [p.grad for p in model.parameters() if p.grad is not None]
                flat = torch.cat([g.reshape(-1) for g in grads])
                dist.all_reduce(flat, group=pg.group)
                dist.all_reduce(flat, group=pg.replica)
                flat /= world
                off = 0
                for g in grads:
                    g.copy_(flat[off:off + g.numel()].view_as(g))
                    off += g.numel()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if hasattr(norm, "full_tensor"):  # a DTensor under fully_shard
                norm = norm.full_tensor()
            opt.step()
            sched.step()
            mean = loss.detach().reshape(1).clone()
            dist.all_reduce(mean)
            mean = mean.item() / world
            if a.pace:
                time.sleep(a.pace / 1e3)
            m = bmt.report_step(tokens=tokens, samples=a.batch, loss=mean, flops=flops,
                                step=step, params=params, lr=sched.get_last_lr()[0],
                                grad_norm=float(norm))
            if rank == 0:
                print("step %3d/%d | loss %.4f | norm %.3f | %.1f ms | %.0f tok/s" % (
                    step, a.steps, mean, float(norm), m["step_time_s"] * 1e3,
                    m["tokens_per_s"] * world), flush=True)
            pre.step_boundary(step)
    if a.save_dir and first <= a.steps:  # else a later step's model would be saved as --steps
        path = save(a.steps)
        bmt.report_event("checkpoint_saved", path)
    dist.barrier()
    dist.destroy_process_group()


def save_checkpoint(model, opt, sched, save_dir, step, rank, sharded):
    """SAVE_DIR/step-N: the model and optimizer (rank 0's whole state in data
    parallel; every rank's shards through torch.distributed.checkpoint when
    sharded), then SAVE_DIR/latest names it. Returns its path."""
    path = os.path.join(save_dir, "step-%08d" % step)
    os.makedirs(path, exist_ok=True)
    if sharded:  # every rank writes its shards
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=path)
    elif rank == 0:
        torch.save({"model": model.state_dict(), "optim": opt.state_dict(),
                    "sched": sched.state_dict(), "step": step}, os.path.join(path, "state.pt"))
    dist.barrier()
    if rank == 0:
        tmp = os.path.join(save_dir, "latest.tmp")
        with open(tmp, "w") as f:
            f.write("step-%08d\n" % step)
        os.replace(tmp, os.path.join(save_dir, "latest"))
    print("train.py: rank %d: saved step %d in %s" % (rank, step, path), flush=True)
    return path


def load(model, opt, sched, save_dir, sharded):
    """Load SAVE_DIR/latest; returns the step to continue from."""
    name = open(os.path.join(save_dir, "latest")).read().strip()
    path = os.path.join(save_dir, name)
    step = int(name.split("-")[1])
    if sharded:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    else:
        st = torch.load(os.path.join(path, "state.pt"), map_location="cpu")
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["optim"])
        sched.load_state_dict(st["sched"])
    for _ in range(step if sharded else 0):
        sched.step()
    return step + 1


if __name__ == "__main__":
    main()
