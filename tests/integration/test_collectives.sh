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

test_expect_success "no shared-memory segment is left behind" '
    ! ls /dev/shm | grep -q "^bmt-"
'

test_done
