#!/bin/bash
# GPU tests (make check-gpu, on a machine with >= 2 GPUs): every collective on the
# world, group and replica communicators with the nccl backend in layouts 1x2
# and 2x1, the demo, and a missing peer turning into a deadline error.
. "$(dirname "$0")/../integration/lib.sh"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}

gpu_require 2

for layout in 1x2 2x1; do
    g=${layout%x*} n=${layout#*x}
    test_expect_success "collectives ${g}x${n} (nccl)" "
        with_timeout 300 \$BMLAUNCH --device cuda -g $g -n $n --timeout 120 -- \$PROGS/collcheck >out 2>err &&
        test \$(grep -c 'nccl on cuda' out) -eq 2
    "
done

test_expect_success "the demo on two GPUs" '
    with_timeout 120 $BMLAUNCH --device cuda -g 2 -n 1 -- $PROGS/hello >out &&
    grep -q "^1: rank 1 of 2 .* device cuda:1, backend nccl; sums of ranks: world 1, group 1, replica 1" out
'

test_expect_success "a missing peer: a deadline error, and the job ends" '
    start=$(date +%s)
    { with_timeout 60 $BMLAUNCH --device cuda -n 2 --timeout 5 -- $PROGS/behave --rank 1 stall >out 2>err; rc=$?; } &&
    test $rc -eq 1 && test $(( $(date +%s) - start )) -lt 40 &&
    grep -q "did not complete within 5.0 s: a peer of world is missing or stuck (BMT_TIMEOUT)" err
'
test_done
