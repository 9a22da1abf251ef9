#!/bin/bash
# bench/gpu/foundation.sh — on the GPU machine: build, run the collective test
# with the nccl backend in layouts 1x2 and 2x1, the deadline test, and
# bench/comm against direct NCCL. Logs under $OUT (or ./gpu-out).
#   carry: .device-deps (Debian libjansson-dev, see docs/building.md)
set -u
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
nvidia-smi -L | tee "$OUT/gpus.txt"
bench/gpu/build.sh || exit 1
grep -E "warning|notice|bmt:" "$OUT/build.log" | head
B=build/bin/bmlaunch
declare -A result
for layout in 1x2 2x1; do
    g=${layout%x*} n=${layout#*x}
    start=$(date +%s.%N)
    timeout 300 $B --device cuda -g $g -n $n --timeout 120 -- build/tests/progs/collcheck \
        >"$OUT/collcheck-$layout.log" 2>&1
    rc=$?
    t=$(awk -v a=$start -v b=$(date +%s.%N) 'BEGIN{printf "%.1f", b-a}')
    result[collcheck-$layout]="rc=$rc ${t}s $(grep -c 'checks passed' "$OUT/collcheck-$layout.log")/2 ranks passed"
    grep -E "checks passed|error|collcheck:" "$OUT/collcheck-$layout.log" | head -4
done
timeout 120 $B --device cuda -g 2 -n 1 -- build/tests/progs/hello >"$OUT/hello.log" 2>&1
result[hello-2x1]="rc=$? $(grep -c 'backend nccl; sums of ranks' "$OUT/hello.log")/2 lines"
cat "$OUT/hello.log"
start=$(date +%s.%N)
timeout 120 $B --device cuda -n 2 --timeout 5 -- build/tests/progs/behave --rank 1 stall >"$OUT/stall.log" 2>&1
rc=$?
t=$(awk -v a=$start -v b=$(date +%s.%N) 'BEGIN{printf "%.1f", b-a}')
result[stall]="rc=$rc ${t}s"
grep -E "rank 0|job failed" "$OUT/stall.log" | head -3
for c in world; do
    timeout 400 $B --device cuda -n 2 -- build/bench/comm --csv "$OUT/comm-nccl-1x2.csv" >"$OUT/comm-1x2.log" 2>&1
    result[bench-1x2]="rc=$?"
done
cat "$OUT/comm-1x2.log"
BUILDDIR=build timeout 500 tests/run gpu >"$OUT/check-gpu.log" 2>&1
result[check-gpu]="$(tail -1 "$OUT/check-gpu.log")"
echo
echo "== summary =="
for k in "${!result[@]}"; do echo "$k: ${result[$k]}"; done | sort
