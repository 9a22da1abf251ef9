#!/bin/bash
# bench/gpu/engine.sh — on the GPU machine (2 GPUs): build, run the GPU test
# suite (kernels, nccl collectives, the engine in layouts 1x2 and 2x1) and the
# prefetch-overlap benchmark. Logs under $OUT; a short table last.
#   carry: .device-deps (Debian libjansson-dev, see docs/building.md)
set -u
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
bench/gpu/build.sh || exit 1
start=$(date +%s)
BUILDDIR=build timeout 400 tests/run gpu >"$OUT/check-gpu.log" 2>&1
echo "tests/run gpu: $(( $(date +%s) - start )) s"
grep -E "passed|not ok" "$OUT/check-gpu.log" | head -20
for layout in 1x2; do
    g=${layout%x*} n=${layout#*x}
    timeout 120 build/bin/bmlaunch --device cuda -g $g -n $n -- build/bench/overlap \
        >"$OUT/overlap-$layout.log" 2>&1
    sed 's/^0: //' "$OUT/overlap-$layout.log" | grep -v "^1: "
done
