#!/bin/bash
# bench/gpu/ncu_ops.sh — Nsight Compute's view of single kernels at the Llama
# shapes: `llama_ops_check --bench-only` (1B: B 2, T 4096, 32 heads of 64, 8
# KV heads; then the 3B-like shape at head 128) runs under ncu once per
# kernel named, and the first launch of each is profiled with the sections
# that say why a kernel waits (speed of light, scheduler and warp states,
# occupancy, instruction mix). Where profile.sh says how long each kernel of a
# step takes, this says why one of them takes that long.
#
#   KERNELS="mfa_bwd_dkdv_wg mfa_bwd_dq_wg" bench/gpu/ncu_ops.sh
#   SKIP=N      skip the first N launches of each (the 3B shape's come after
#               the 1B's: mfa_fwd_wg_k128 has only 3B launches; the head-64
#               kernels' first launch is the 1B shape)
#   ENVS="BMT_DEV_FWD=8"   environment for the check (a patch's variant)
#
# KERNELS are function names without templates or namespaces (ncu's
# --kernel-name-base function). Needs a build of build/tests/gpu/llama_ops_check
# (bench/gpu/build.sh). Reports: $OUT/ncu_<kernel>.txt whole, and the lines
# that matter in $OUT/ncu_sum.txt (printed).
set -u
OUT=${OUT:-$PWD/gpu-out}
export NCCL_NVLS_ENABLE=0
mkdir -p "$OUT"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "ncu_ops.sh: no ncu on this machine (PATH, /usr/local/cuda/bin)" >&2; exit 3; }
[ -x build/tests/gpu/llama_ops_check ] ||
    { echo "ncu_ops.sh: build build/tests/gpu/llama_ops_check first (bench/gpu/build.sh)" >&2; exit 2; }
[ -n "${KERNELS:-}" ] || { echo "ncu_ops.sh: KERNELS=\"name ...\", e.g. KERNELS=mfa_bwd_dq_wg" >&2; exit 2; }
case "${SKIP:-0}" in *[!0-9]*) echo "ncu_ops.sh: SKIP is a whole number (got '$SKIP')" >&2; exit 2 ;; esac
for k in $KERNELS; do
    case "$k" in *[!A-Za-z0-9_]*) echo "ncu_ops.sh: '$k' is not a function name" >&2; exit 2 ;; esac
    f="$OUT/ncu_$k.txt"
    # shellcheck disable=SC2086 # ENVS is a list of NAME=VALUE words
    env ${ENVS:-} timeout "${NCU_TIMEOUT:-120}" "$NCU" --kernel-name-base function --kernel-name "$k" \
        --launch-skip "${SKIP:-0}" --launch-count 1 \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
        --section MemoryWorkloadAnalysis --section Occupancy --section SchedulerStats \
        --section InstructionStats --section LaunchStats \
        build/tests/gpu/llama_ops_check --bench-only >"$f" 2>&1
    echo "== $k ${ENVS:-} skip ${SKIP:-0}: ncu rc $?" | tee -a "$OUT/ncu_sum.txt"
    grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|Executed Ipc Active|Warp Cycles Per Issued|No Eligible|Eligible Warps|Active Warps Per|Registers Per|Achieved Occupancy|Block Limit|Dynamic Shared|highest-utilized|Stall|stall" \
        "$f" | sed 's/  */ /g' | head -40 | tee -a "$OUT/ncu_sum.txt"
done
