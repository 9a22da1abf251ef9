#!/bin/bash
# Every collective on the world, group and replica communicators, through the
# real bmlaunch, with 1, 2, 4 and 8 CPU ranks in several layouts (shm backend).
# collcheck computes every expected value itself and exits 1 on a mismatch.
. "$(dirname "$0")/lib.sh"

for layout in 1x1 1x2 2x1 1x4 2x2 4x1 2x4; do
    g=${layout%x*} n=${layout#*x}
    test_expect_success "collectives ${g}x${n} (shm)" "
        with_timeout 120 \$BMLAUNCH --groups $g --gpus-per-group $n --timeout 60 -- \$PROGS/collcheck >out 2>err &&
        test \$(grep -c 'checks passed' out) -eq $((g * n)) &&
        grep -q 'world($((g * n))), group($n), replica($g)' out
    "
done

test_expect_success "collectives with a 4 KiB staging chunk (many chunks per call)" '
    BMT_SHM_CHUNK=4K with_timeout 120 $BMLAUNCH -g 2 -n 2 --timeout 60 -- $PROGS/collcheck --quick >out &&
    test $(grep -c "checks passed" out) -eq 4
'

test_expect_success "the demo program: sums over the three communicators" '
    with_timeout 60 $BMLAUNCH --groups 2 --gpus-per-group 2 --device cpu -- $PROGS/hello >out &&
    grep -q "^0: rank 0 of 4 .* group 0 rank 0, device cpu, backend shm; sums of ranks: world 6, group 1, replica 2" out &&
    grep -q "^3: rank 3 of 4 .* group 1 rank 1, device cpu, backend shm; sums of ranks: world 6, group 5, replica 4" out
'

test_expect_success "a missing peer turns a collective into an error naming it, not a hang" '
    start=$(date +%s.%N)
    test_must_fail with_timeout 30 $BMLAUNCH -n 3 --timeout 1 -- $PROGS/behave --rank 1 stall 2>err &&
    end=$(date +%s.%N) &&
    grep -q "rank [02]: world: barrier: timed out after 1.0 s waiting for rank 1 (world rank 1) (BMT_TIMEOUT)" err &&
    grep -q "bmlaunch: job failed: rank [02]" err &&
    awk -v a=$start -v b=$end "BEGIN { exit !(b - a < 10) }"
'

# Ranks that disagree about a collective (collcheck --differ: rank 1 issues B
# where rank 0 issues A). The shm backend compares (kind, count, dtype, op, root)
# at the first sync of every collective even without the knob;
# BMT_CHECK_COLLECTIVES=1 checks before the collective, with an all-gather of
# descriptors that also carry the communicator and the call number. Either way
# every rank fails and the job exits 1; collcheck exits 3 on a call that returned 0.
while IFS="|" read -r what a b; do
    test_expect_success "BMT_CHECK_COLLECTIVES=1: ranks that differ in $what fail, naming rank 1 and both calls" "
        { BMT_CHECK_COLLECTIVES=1 with_timeout 60 \$BMLAUNCH -n 2 --timeout 20 -- \$PROGS/collcheck --differ $what >out 2>&1; rc=\$?; } &&
        test \$rc -eq 1 && ! grep -q 'returned 0' out &&
        grep -F 'collective check (world, call #3): rank 1 issued $b while rank 0 issued $a' out
    "
    test_expect_success "shm without the knob: ranks that differ in $what fail too, never return 0" "
        { with_timeout 60 \$BMLAUNCH -n 2 --timeout 20 -- \$PROGS/collcheck --differ $what >out 2>&1; rc=\$?; } &&
        test \$rc -eq 1 && ! grep -q 'returned 0' out &&
        grep -E 'rank [01]: world: [a-z_]+: the ranks called different collectives: ' out |
            grep -F 'rank 1 issued $b while rank 0 issued $a'
    "
done <<'CASES'
kind|all_reduce(count 1, f64, sum)|all_gather(count 4096, bf16)
count|all_reduce(count 1000, f32, sum)|all_reduce(count 1001, f32, sum)
dtype|all_gather(count 100, f32)|all_gather(count 100, bf16)
op|all_reduce(count 64, f32, sum)|all_reduce(count 64, f32, max)
root|broadcast(count 10, f32, root 0)|broadcast(count 10, f32, root 1)
CASES

test_expect_success "BMT_CHECK_COLLECTIVES=1 on a group communicator names comm and world ranks" '
    { BMT_CHECK_COLLECTIVES=1 with_timeout 60 $BMLAUNCH -g 2 -n 2 --timeout 20 -- $PROGS/collcheck --differ kind --comm group >out 2>&1; rc=$?; } &&
    test $rc -eq 1 && ! grep -q "returned 0" out &&
    grep -F "collective check (group 1, call #3): rank 1 (world rank 3) issued all_gather(count 4096, bf16) while rank 0 (world rank 2) issued all_reduce(count 1, f64, sum)" out
'

test_expect_success "shm without the knob on a group communicator names comm and world ranks" '
    { with_timeout 60 $BMLAUNCH -g 2 -n 2 --timeout 20 -- $PROGS/collcheck --differ kind --comm group >out 2>&1; rc=$?; } &&
    test $rc -eq 1 && ! grep -q "returned 0" out &&
    grep -F "group 1: all_" out |
        grep -F "the ranks called different collectives: rank 1 (world rank 3) issued all_gather(count 4096, bf16) while rank 0 (world rank 2) issued all_reduce(count 1, f64, sum)"
'

test_expect_success "BMT_CHECK_COLLECTIVES=1: a correct program passes every check, as without it (2x2)" '
    with_timeout 180 $BMLAUNCH -g 2 -n 2 --timeout 60 -- $PROGS/collcheck --quick >off &&
    BMT_CHECK_COLLECTIVES=1 with_timeout 180 $BMLAUNCH -g 2 -n 2 --timeout 60 -- $PROGS/collcheck --quick >on &&
    sed -n "s/^\([0-9]\): .* \([0-9]*\) checks passed .*/\1 \2/p" off | sort >off.n &&
    sed -n "s/^\([0-9]\): .* \([0-9]*\) checks passed .*/\1 \2/p" on | sort >on.n &&
    test $(wc -l <on.n) -eq 4 && cmp off.n on.n
'

test_expect_success "a malformed BMT_CHECK_COLLECTIVES fails bmt_init, naming it" '
    { BMT_CHECK_COLLECTIVES=yes with_timeout 30 $BMLAUNCH -n 2 -- $PROGS/collcheck >out 2>&1; rc=$?; } &&
    test $rc -eq 1 &&
    grep "collcheck: bmt_init: BMT_CHECK_COLLECTIVES=.yes. is not 0 or 1" out
'

test_expect_success "no shared-memory segment is left behind" '
    ! ls /dev/shm | grep -q "^bmt-"
'

test_done
