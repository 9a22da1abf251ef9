#!/bin/bash
# examples/torch/gpu_check.sh — the example's GPU path, on the GPU machine
# (docs/python.md; CI has no GPU and Debian's torch 1.13 has no fully_shard).
# From the repository root, with .device-deps carried (docs/building.md, "The
# GPU machine"): builds bmlaunch alone (NO_CUDA=1 in build-gpu: Python ranks
# need no CUDA in libbmt; or BMLAUNCH=path uses one built already), then runs
# examples/torch/train.py
#   1. on CPU 2 x 2 with this torch: bmt.torch.device_mesh on gloo, hierarchical
#      data parallel;
#   2. on the GPUs (1 x 1, 1 x 2 or 2 x 2 by their number) with fully_shard on
#      the mesh: metrics (MFU from the GPU's peak), SIGUSR1 to bmlaunch (saved
#      on every rank, exit 0), then --resume from that checkpoint.
# Prints what it saw; exit status 0 when every step above did what it should.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
fail() { echo "gpu_check: FAILED: $*"; exit 1; }
python3 -c 'import torch; print("gpu_check: torch", torch.__version__, "GPUs", torch.cuda.device_count())'
if [ -z "${BMLAUNCH:-}" ]; then # else: a bmlaunch built already (bench/gpu/build.sh)
    OUT=$OUT bench/gpu/build.sh NO_CUDA=1 BUILDDIR=build-gpu build-gpu/bin/bmlaunch || fail "build"
fi
B=${BMLAUNCH:-build-gpu/bin/bmlaunch} T=examples/torch/train.py
rm -rf "$OUT/ckc" "$OUT/ckg"

echo "=== 1. cpu 2 x 2"
timeout 300 $B --metrics-port 0 -g 2 -n 2 --device cpu -- python3 $T --steps 10 >"$OUT/cpu.out" 2>&1 ||
    { tail -20 "$OUT/cpu.out"; fail "cpu run"; }
grep -v "^0: step  *[2-9]/" "$OUT/cpu.out"
grep -q "^0: train.py: DeviceMesh" "$OUT/cpu.out" || fail "no mesh on cpu"

G=$(python3 -c 'import torch; print(torch.cuda.device_count())')
case $G in 0) fail "no GPU" ;; 1) L="-g 1 -n 1" ;; 2 | 3) L="-g 1 -n 2" ;; *) L="-g 2 -n 2" ;; esac
echo "=== 2. cuda $L: fully_shard, metrics, SIGUSR1, resume"
ARGS="--layers 4 --embd 256 --heads 4 --batch 16 --seq 256 --save-dir $OUT/ckg"
$B --metrics-port 19777 --metrics-linger 30 $L --device cuda -- python3 $T --steps 100000 $ARGS \
    >"$OUT/gpu.out" 2>"$OUT/gpu.err" &
J=$!
for i in $(seq 900); do grep -q "step  *20/" "$OUT/gpu.out" 2>/dev/null && break; sleep 0.2; done
curl -s localhost:19777/metrics | grep -E "^bmt_(mfu_ratio|tokens_per_second|step)\{"
kill -USR1 $J
for i in $(seq 300); do curl -s localhost:19777/api/status | grep -q '"state":"ended"' && break; sleep 0.2; done
curl -s localhost:19777/api/status >"$OUT/status.json"
kill -INT $J; wait $J; rc=$?
grep -v "step  *[0-9]*/100000" "$OUT/gpu.out"; tail -5 "$OUT/gpu.err"
test $rc -eq 0 || fail "bmlaunch exited $rc after SIGUSR1"
grep -q "^0: train.py: .*| fully_shard on the" "$OUT/gpu.out" || fail "not fully_shard"
python3 - "$OUT/status.json" <<'PY' || fail "status"
import json, sys
s = json.load(open(sys.argv[1]))
saved = {(e["rank"], e["step"]) for e in s["events"] if e["kind"] == "checkpoint_saved"}
steps = {st for _, st in saved}
print("gpu_check: exit", s["exit_status"], "saved", sorted(saved), "mfu", s.get("mfu"))
assert s["exit_status"] == 0 and len(steps) == 1 and len(saved) == s["layout"]["world"], saved
PY
n=$(sed -n "s/^0: train.py: rank 0: saved step \([0-9]*\) .*/\1/p" "$OUT/gpu.out")
timeout 300 $B --metrics-port 0 $L --device cuda -- python3 $T --steps $((n + 5)) --resume $ARGS \
    >"$OUT/resume.out" 2>&1 || { tail -20 "$OUT/resume.out"; fail "resume"; }
grep -E "resumed|step  *$((n + 1))/" "$OUT/resume.out"
grep -q "^0: train.py: resumed from .* at step $((n + 1))$" "$OUT/resume.out" || fail "no resume"
echo "gpu_check: ok"
