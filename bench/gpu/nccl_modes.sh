#!/bin/bash
# bench/gpu/nccl_modes.sh — bmt next to direct NCCL in three modes: blocking,
# non-blocking, and non-blocking waited on the way bmt waits. This is the
# experiment behind comm_nccl.c's split of roles (bench/NOTES.md, 2026-11-30).
# Run after bench/gpu/foundation.sh built the tree.
set -u
OUT=${OUT:-$PWD/gpu-out}
export NCCL_NVLS_ENABLE=0 BENCH_STEP=16
for peer in blocking nonblocking nonblocking-poll; do
    echo "== BENCH_PEER=$peer"
    BENCH_PEER=$peer timeout 200 build/bin/bmlaunch --device cuda -n 2 -- \
        build/bench/comm --min 1K --max 256M --csv "$OUT/modes-$peer.csv" 2>&1 |
        grep -E "all_reduce|all_gather" | sed 's/^0: //'
done
