#!/bin/bash
# bench/gpu/all.sh — one device call's worth of GPU work for the GPT-2 path, in
# the order a change needs it: build (bench/gpu/build.sh), every CUDA layer
# against the CPU (gpt2_ops_check), the per-layer timer (--bench), the HF
# oracle (tests/gpu/test_gpt2.sh; TG=0 skips it), then the benchmark table
# (bench/gpu/gpt2.sh with RUNS, STEPS, PEER_RUNS passed through; BENCH=0 skips it). Logs under
# $OUT (at most 8 files come back from the device: the runs' logs are tarred);
# the summary lines and the table are printed last. carry: .device-deps.
set -u
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT" /tmp/bmt-runs
export NCCL_NVLS_ENABLE=0
T0=$(date +%s)
t() { echo "t=$(($(date +%s) - T0)) s"; }
bench/gpu/build.sh || exit 1
echo "build: $(t)"
timeout 150 build/tests/gpu/gpt2_ops_check >"$OUT/ops.log" 2>&1
echo "gpt2_ops_check rc $?: $(grep -c '^ok' "$OUT/ops.log") ok, $(grep -c '^not ok' "$OUT/ops.log") not ok; $(t)"
grep '^not ok' "$OUT/ops.log" | head -20
timeout 60 build/tests/gpu/gpt2_ops_check --bench >"$OUT/opsbench.log" 2>&1
if [ "${TG:-1}" = 1 ]; then
    GPT2_CURVES=/tmp/bmt-runs timeout 300 tests/run gpu test_gpt2.sh >"$OUT/test_gpt2.log" 2>&1
    echo "test_gpt2 rc $?: $(t)"
    cp build/test-logs/gpu_test_gpt2.log "$OUT/" 2>/dev/null
fi
if [ "${BENCH:-1}" = 1 ]; then
    OUT=/tmp/bmt-runs SKIP_BUILD=1 timeout $((570 - ($(date +%s) - T0))) bench/gpu/gpt2.sh >"$OUT/bench.log" 2>&1
    echo "gpt2.sh: $(t)"
fi
tar czf "$OUT/runlogs.tgz" -C /tmp/bmt-runs . 2>/dev/null
grep '^#' "$OUT/opsbench.log"
grep -h '^# ok\|^# not ok\|^ok\|^not ok' "$OUT/gpu_test_gpt2.log" 2>/dev/null
if [ -f "$OUT/bench.log" ]; then tail -12 "$OUT/bench.log"; fi
