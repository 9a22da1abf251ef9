#!/bin/bash
# GPU tests (make check-gpu, on a machine with >= 2 GPUs): every collective on the
# world, group and replica communicators with the nccl backend in layouts 1x2
# and 2x1, the demo, a missing peer turning into a deadline error, and
# BMT_CHECK_COLLECTIVES=1: correct programs (collcheck, and engine_check for the
# engine's stream-ordered collectives) still pass, and ranks that issue
# different collectives fail with a message naming rank 1 and both calls.
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

test_expect_success "BMT_CHECK_COLLECTIVES=1: every collective still passes (nccl 2x1)" '
    BMT_CHECK_COLLECTIVES=1 with_timeout 300 $BMLAUNCH --device cuda -g 2 -n 1 --timeout 120 -- $PROGS/collcheck --quick >out 2>err &&
    test $(grep -c "nccl on cuda" out) -eq 2
'

test_expect_success "BMT_CHECK_COLLECTIVES=1: the engine (stream-ordered collectives) still passes (cuda 1x2)" '
    BMT_CHECK_COLLECTIVES=1 with_timeout 300 $BMLAUNCH --device cuda -g 1 -n 2 --timeout 120 -- $PROGS/engine_check >out 2>err &&
    grep -q "^0: engine_check: [0-9]* checks passed, 0 failed on 2 ranks" out && ! grep -q FAIL out
'

test_expect_success "ranks that disagree on BMT_CHECK_COLLECTIVES fail bmt_init on nccl, before any collective" '
    # before, rank 1 paired its descriptor all-gather with the real collectives of rank 0
    { with_timeout 120 $BMLAUNCH --device cuda -n 2 --timeout 30 -- \
        sh -c "test \$BMT_RANK = 0 || export BMT_CHECK_COLLECTIVES=1; exec $PROGS/collcheck --quick" >out 2>&1; rc=$?; } &&
    test $rc -eq 1 && ! grep -q "checks passed" out &&
    grep -q "the ranks disagree on BMT_CHECK_COLLECTIVES: rank 1 has 1, rank 0 0; set it alike on every rank" out
'

test_expect_success "cuda: ranks on logical nodes of one machine are refused before two of them share a GPU" '
    # --device cpu lets bmlaunch plan 2 nodes of 1 here; the ranks then ask for cuda
    { with_timeout 120 $BMLAUNCH --device cpu -n 2 --gpus-per-node 1 --timeout 30 -- \
        env BMT_DEVICE=cuda $PROGS/hello >out 2>&1; rc=$?; } &&
    test $rc -eq 1 && ! grep -q "sums of ranks" out &&
    grep -q "rank 1: PMIx places it as local rank 1 of 2 on .*, but the layout (1 ranks per node) makes it local rank 0 and would give it cuda:0" out
'

# collcheck --differ: rank 1 issues B where rank 0 issues A (see collcheck.c);
# exit 3 would mean a mismatched call returned 0.
while IFS="|" read -r what a b; do
    test_expect_success "BMT_CHECK_COLLECTIVES=1: ranks that differ in $what fail at once on nccl, naming rank 1 and both calls" "
        start=\$(date +%s)
        { BMT_CHECK_COLLECTIVES=1 with_timeout 120 \$BMLAUNCH --device cuda -n 2 --timeout 30 -- \$PROGS/collcheck --differ $what >out 2>&1; rc=\$?; } &&
        test \$rc -eq 1 && test \$(( \$(date +%s) - start )) -lt 60 && ! grep -q 'returned 0' out &&
        grep -F 'collective check (world, call #3): rank 1 issued $b while rank 0 issued $a' out
    "
done <<'CASES'
kind|all_reduce(count 1, f64, sum)|all_gather(count 4096, bf16)
count|all_reduce(count 1000, f32, sum)|all_reduce(count 1001, f32, sum)
root|broadcast(count 10, f32, root 0)|broadcast(count 10, f32, root 1)
CASES
test_done
