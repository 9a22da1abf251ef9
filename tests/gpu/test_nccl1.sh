#!/bin/bash
# GPU tests (make check-gpu, on a machine with >= 1 GPU): every collective of
# collcheck on the nccl backend with communicators of one rank (1x1: world,
# group and replica each of one). NCCL before 2.29.7 left the last elements of
# a one-rank average unwritten when the count is not a multiple of its block
# count (NVIDIA/nccl#1950: collcheck's reduce_scatter avg f32 count 70001 read
# -nan, its poison, at element 69984); bmt sums there instead (x / 1 is x).
. "$(dirname "$0")/../integration/lib.sh"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
gpu_require 1

for q in "" --quick; do # both count sets: 70001 (--quick) is one NCCL 2.28.3 got wrong
    test_expect_success "collectives 1x1 ${q:-(full counts)} (nccl, communicators of one rank; the average included)" "
        with_timeout 300 \$BMLAUNCH --device cuda -n 1 --timeout 120 -- \$PROGS/collcheck $q >out 2>err &&
        grep -q 'nccl on cuda' out || { cat err; exit 1; }
    "
done
test_done
