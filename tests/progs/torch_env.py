"""tests/progs/torch_env.py — an unmodified torch.distributed program under bmlaunch.

It knows nothing of bmlaunch but the BMT_ layout variables it compares torchrun's
variables against: init_process_group("gloo") with the default env://, then
all-reduces over the world, over its group (new_group of the ranks of its
BMT_GROUP) and over its replica (the ranks with its BMT_GROUP_RANK), and checks
the sums. One line per rank says what it saw, for tests/integration/test_torch_launch.sh
and tests/slurm/test_bmlaunch.sh.

  torch_env.py                      check, print, exit 0
  torch_env.py --fail R [--code N]  rank R raises after the checks (or sys.exit(N));
                                    the others wait to be ended by bmlaunch
  torch_env.py --fail-until K ...   fail only while TORCHELASTIC_RESTART_COUNT < K
  torch_env.py --backend nccl       on cuda:LOCAL_RANK with NCCL (tests/gpu/)
"""
import argparse
import os
import socket
import sys
import time

import torch
import torch.distributed as dist


def env_int(name):
    value = os.environ.get(name)
    if value is None:
        sys.exit("torch_env: %s is not set" % name)
    return int(value)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fail", type=int, default=-1)
    ap.add_argument("--code", type=int, default=0)
    ap.add_argument("--fail-until", type=int, default=1 << 30)
    ap.add_argument("--backend", default="gloo")
    args = ap.parse_args()

    rank, world = env_int("RANK"), env_int("WORLD_SIZE")
    restart = env_int("TORCHELASTIC_RESTART_COUNT")
    # torchrun's variables against bmlaunch's layout (docs/env.md).
    same = {
        "RANK": "BMT_RANK",
        "WORLD_SIZE": "BMT_WORLD_SIZE",
        "LOCAL_RANK": "BMT_LOCAL_RANK",
        "LOCAL_WORLD_SIZE": "BMT_GPUS_PER_NODE",
        "GROUP_RANK": "BMT_NODE",
        "NODE_RANK": "BMT_NODE",
        "GROUP_WORLD_SIZE": "BMT_NODES",
        "ROLE_RANK": "BMT_RANK",
        "ROLE_WORLD_SIZE": "BMT_WORLD_SIZE",
        "TORCHELASTIC_RESTART_COUNT": "BMT_RESTART",
        "TORCHELASTIC_RUN_ID": "BMT_JOB_ID",
    }
    for torch_name, bmt_name in same.items():
        if os.environ.get(torch_name) != os.environ.get(bmt_name):
            sys.exit("torch_env: rank %d: %s=%s but %s=%s" % (rank, torch_name,
                     os.environ.get(torch_name), bmt_name, os.environ.get(bmt_name)))
    for name in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_MAX_RESTARTS"):
        if not os.environ.get(name):
            sys.exit("torch_env: rank %d: %s is not set" % (rank, name))
    if os.environ.get("ROLE_NAME") != "default":
        sys.exit("torch_env: rank %d: ROLE_NAME=%s" % (rank, os.environ.get("ROLE_NAME")))

    device = torch.device("cpu")
    if args.backend == "nccl":
        device = torch.device("cuda", env_int("LOCAL_RANK"))
        torch.cuda.set_device(device)
    dist.init_process_group(backend=args.backend)  # env://, as torchrun users write it
    assert dist.get_rank() == rank and dist.get_world_size() == world

    gpg = env_int("BMT_GPUS_PER_GROUP")
    groups = world // gpg
    group, group_rank = rank // gpg, rank % gpg
    # Every rank creates every group, in the same order (torch requires it).
    group_pgs = [dist.new_group([g * gpg + i for i in range(gpg)]) for g in range(groups)]
    replica_pgs = [dist.new_group([g * gpg + i for g in range(groups)]) for i in range(gpg)]

    def allreduce(value, pg=None):
        t = torch.tensor([float(value)], device=device)
        dist.all_reduce(t, group=pg)
        return int(t.item())

    got = {
        "world": allreduce(rank + 1),
        "group": allreduce(rank + 1, group_pgs[group]),
        "replica": allreduce(rank + 1, replica_pgs[group_rank]),
    }
    want = {
        "world": world * (world + 1) // 2,
        "group": sum(group * gpg + i + 1 for i in range(gpg)),
        "replica": sum(g * gpg + group_rank + 1 for g in range(groups)),
    }
    if got != want:
        sys.exit("torch_env: rank %d: sums %s, expected %s" % (rank, got, want))
    hosts = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    print("torch_env: rank %d of %d: env ok; sums world %d group %d replica %d; hosts %s; "
          "restart %d; master %s:%s; %s on %s" % (
              rank, world, got["world"], got["group"], got["replica"],
              ",".join(sorted(set(hosts))), restart, os.environ["MASTER_ADDR"],
              os.environ["MASTER_PORT"], dist.get_backend(), device), flush=True)

    if args.fail >= 0 and restart < args.fail_until:
        if rank == args.fail:
            if args.code:
                print("torch_env: rank %d: sys.exit(%d)" % (rank, args.code), flush=True)
                sys.exit(args.code)
            raise RuntimeError("torch_env: rank %d fails on purpose" % rank)
        time.sleep(300)  # until bmlaunch ends the job
    dist.barrier()  # rank 0 holds the store: nobody leaves before all are done
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
