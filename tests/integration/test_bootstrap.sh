#!/bin/bash
# Joining the job: PMIx keys and BMT_ environment agree, every peer's placement
# and communicator membership check out at several sizes, and misconfigured
# environments give clear errors.
. "$(dirname "$0")/lib.sh"

for layout in 1x1 2x4 8x8 16x16; do
    g=${layout%x*} n=${layout#*x}
    desc="bootstrap ${g}x${n}: every peer checks out (backend none)"
    # 256 ranks: a load test under the sanitizers (BMT_NO_LOAD_TESTS, lib.sh)
    [ $((g * n)) -lt 256 ] || desc="$((g * n)) ranks: $desc"
    test_expect_success "$desc" "
        with_timeout 120 \$BMLAUNCH -g $g -n $n -- \$PROGS/bootcheck >out &&
        grep -q \"^0: bootcheck: rank 0: $((g * n)) ranks ($g x $n) on 1 host\" out
    "
done

test_expect_success "1000 ranks (40 x 25): bootstrap-only job completes, every peer checked" '
    with_timeout 120 $BMLAUNCH --groups 40 --gpus-per-group 25 --device cpu --timeout 100 -- $PROGS/bootcheck >out &&
    grep -q "^0: bootcheck: rank 0: 1000 ranks (40 x 25) on 1 host .*(1000 checked here)" out
'

test_expect_success "logical nodes on one machine: 2 groups of 4 on 2 nodes of 4 (shm)" '
    $BMLAUNCH -g 2 -n 4 --gpus-per-node 4 -- $PROGS/bootcheck --all >out &&
    test $(grep -c "every peer" out) -eq 8 &&
    $BMLAUNCH -g 2 -n 4 --gpus-per-node 4 -- $PROGS/behave env >env &&
    grep -qx "5: BMT_NODE=1" env && grep -qx "5: BMT_LOCAL_RANK=1" env &&
    $BMLAUNCH -g 4 -n 2 --gpus-per-node 4 --timeout 60 -- $PROGS/collcheck --quick >cc &&
    test $(grep -c "checks passed" cc) -eq 8
'

test_expect_success "a program started without bmlaunch runs as a job of one" '
    env -u PMIX_NAMESPACE $PROGS/hello >out &&
    grep -q "rank 0 of 1 .* backend shm; sums of ranks: world 0, group 0, replica 0" out
'

test_expect_success "a job of one whose environment claims more ranks fails clearly" '
    { BMT_GROUPS=2 BMT_GPUS_PER_GROUP=2 $PROGS/hello 2>err; rc=$?; } && test $rc -ne 0 &&
    grep -q "the layout 2 x 2 = 4 ranks does not match the job.s 1 ranks" err &&
    { BMT_GROUPS=2 $PROGS/hello 2>err; rc=$?; } && test $rc -ne 0 &&
    grep -q "rank 0: BMT_GROUPS=2 does not divide the job.s 1 ranks" err
'

test_expect_success "a malformed BMT_TIMEOUT is refused by name" '
    { BMT_TIMEOUT=soon $PROGS/hello 2>err; rc=$?; } && test $rc -ne 0 &&
    grep -q "bmt_init: BMT_TIMEOUT=.soon. is not a positive number of seconds" err
'

test_expect_success "a BMT_TIMEOUT beyond an int of seconds is the longest PMIx deadline, not 1 s" '
    # rank 1 joins 2 s late: rank 0 waits for it in the bootstrap fence
    BMT_TIMEOUT=3000000000 with_timeout 60 $BMLAUNCH --metrics-port 0 -n 2 -- \
        sh -c "test \$BMT_RANK = 0 || sleep 2; exec $PROGS/bootcheck" >out 2>err &&
    grep -q "^0: bootcheck: rank 0: 2 ranks (1 x 2)" out && ! grep -q "within 1 s" err
'

test_expect_success "an unknown BMT_BACKEND or BMT_DEVICE is refused by name" '
    { BMT_BACKEND=mpi $PROGS/hello 2>err; rc=$?; } && test $rc -ne 0 &&
    grep -q "unknown communication backend .mpi. (BMT_BACKEND)" err &&
    { BMT_DEVICE=tpu $PROGS/hello 2>err2; rc=$?; } && test $rc -ne 0 &&
    grep -q "unknown device .tpu. (BMT_DEVICE): use cpu or cuda" err2
'

test_expect_success "the none backend builds communicators but refuses to move data" '
    { $BMLAUNCH -n 2 --backend none -- $PROGS/hello 2>err >out; rc=$?; } && test $rc -eq 1 &&
    grep -q "moves no data (BMT_BACKEND=none)" err
'

test_expect_success "--device cuda on a machine without a GPU driver: said once at launch, exit 2, no rank started" '
    if test -e /proc/driver/nvidia/gpus; then echo "# this machine has an NVIDIA driver"; exit 0; fi
    { with_timeout 60 $BMLAUNCH -n 2 --device cuda -- $PROGS/behave env 2>err >out; rc=$?; } &&
    test $rc -eq 2 && test $(grep -c "^bmlaunch: --device cuda, but" err) -eq 1 &&
    grep -q "no NVIDIA driver: libcuda.so.1 cannot be loaded" err && ! grep -q BMT_RANK out &&
    { CUDA_VISIBLE_DEVICES= $BMLAUNCH -n 1 --device cuda -- $PROGS/behave env 2>err >out; rc=$?; } &&
    test $rc -eq 2 && grep -q "this machine shows no GPU" err && ! grep -q BMT_RANK out &&
    # CUDA_VISIBLE_DEVICES shows no GPU without a driver, and -1 (as CUDA
    # reads it: the list ends at the first entry that is not a device) none
    { CUDA_VISIBLE_DEVICES=0,1 with_timeout 60 $BMLAUNCH -n 2 --device cuda -- $PROGS/behave env 2>err >out; rc=$?; } &&
    test $rc -eq 2 && grep -q "no NVIDIA driver: libcuda.so.1 cannot be loaded" err && ! grep -q BMT_RANK out &&
    { CUDA_VISIBLE_DEVICES=-1,0 $BMLAUNCH -n 1 --device cuda -- $PROGS/behave env 2>err >out; rc=$?; } &&
    test $rc -eq 2 && grep -q "this machine shows no GPU" err && ! grep -q BMT_RANK out
'

test_expect_success "a rank program asked for cuda without a usable GPU: a clear error from bmt_init" '
    { BMT_DEVICE=cuda with_timeout 60 $PROGS/hello 2>err >out; rc=$?; } &&
    test $rc -eq 1 && grep -qE "rank 0: (cudaGetDeviceCount|local rank 0 needs cuda:0|device cuda requested)" err
'

test_expect_success "the layout reaches bmt_init through PMIx job keys alone" '
    $BMLAUNCH -g 3 -n 2 -- env -u BMT_GROUPS -u BMT_GPUS_PER_GROUP -u BMT_GPUS_PER_NODE \
        $PROGS/behave init >out &&
    grep -qx "5: init rank 5 group 2 group_rank 1 world 6" out
'

test_expect_success "an environment that contradicts the launcher's PMIx keys is refused" '
    { $BMLAUNCH -g 3 -n 2 -- env BMT_GROUPS=6 BMT_GPUS_PER_GROUP=1 $PROGS/behave init >out 2>err; rc=$?; } &&
    test $rc -eq 1 &&
    grep -q "the launcher registered bmt.groups=3 but the environment says BMT_GROUPS=6" err
'

test_done
