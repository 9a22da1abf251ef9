#!/bin/bash
# bench/gpu/torch_launch.sh — issue 22 item 10 on the GPU machine: the same
# PyTorch script under torchrun and under bmlaunch, in one call.
#   1. start-up overhead: a script that only does init_process_group (nccl),
#      one barrier and destroy, launched 3 times by each (alternating); the
#      median wall time of each launcher and the ratio;
#   2. the loss curve: examples/torch/train.py (fully_shard on the mesh where
#      torch has it) for 40 steps with one seed under each; every step's loss
#      side by side and the largest difference.
# Needs bmlaunch built (bench/gpu/build.sh). GPUs: all of them in one group
# (1 x N), torchrun --standalone --nproc_per_node N.
set -u
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python NCCL_NVLS_ENABLE=0
B=${BMLAUNCH:-build/bin/bmlaunch}
N=$(python3 -c 'import torch; print(torch.cuda.device_count())')
cat >"$OUT/init.py" <<'PY'
import os, torch, torch.distributed as dist
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")
dist.barrier()
dist.destroy_process_group()
PY
now() { date +%s.%N; }
for i in 1 2 3; do
    t0=$(now); torchrun --standalone --nproc_per_node "$N" "$OUT/init.py" >>"$OUT/init-torchrun.log" 2>&1 || echo "torchrun init failed"
    t1=$(now); $B --metrics-port 0 -g 1 -n "$N" --device cuda -- python3 "$OUT/init.py" >>"$OUT/init-bmlaunch.log" 2>&1 || echo "bmlaunch init failed"
    t2=$(now)
    echo "$t0 $t1 $t2" | awk '{ printf "%.3f %.3f\n", $2 - $1, $3 - $2 }' >>"$OUT/init-times"
done
ARGS="--steps 40 --seed 7 --layers 4 --embd 256 --heads 4 --batch 16 --seq 256"
torchrun --standalone --nproc_per_node "$N" examples/torch/train.py $ARGS >"$OUT/train-torchrun.log" 2>&1 || echo "torchrun train failed"
$B --metrics-port 0 -g 1 -n "$N" --device cuda -- python3 examples/torch/train.py $ARGS >"$OUT/train-bmlaunch.log" 2>&1 || echo "bmlaunch train failed"
python3 - "$OUT" "$N" <<'PY'
import re, statistics, sys
out, n = sys.argv[1], sys.argv[2]
t = [tuple(map(float, l.split())) for l in open(out + "/init-times")]
tr, bm = statistics.median(x[0] for x in t), statistics.median(x[1] for x in t)
print("start-up (init_process_group nccl + barrier, %s GPU(s), median of 3): torchrun %.2f s | bmlaunch %.2f s | bmlaunch/torchrun %.2f" % (n, tr, bm, bm / tr))
def losses(f):
    return [float(x) for x in re.findall(r"^(?:0: )?step +\d+/\d+ \| loss ([0-9.]+)", open(f).read(), re.M)]
a, b = losses(out + "/train-torchrun.log"), losses(out + "/train-bmlaunch.log")
mode = re.findall(r"^(?:0: )?train.py: torch .*", open(out + "/train-bmlaunch.log").read(), re.M)
print("train.py:", mode[0] if mode else "(no header line)")
print("loss curve, 40 steps: torchrun %d steps, bmlaunch %d steps" % (len(a), len(b)))
for i in range(0, min(len(a), len(b)), 5):
    print("  step %2d  torchrun %.4f  bmlaunch %.4f" % (i + 1, a[i], b[i]))
if a and len(a) == len(b):
    print("  last     torchrun %.4f  bmlaunch %.4f | largest difference over every step %.2e" % (a[-1], b[-1], max(abs(x - y) for x, y in zip(a, b))))
PY
