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

test_expect_success "a malformed BMT_TIMEOUT is refused by name: words, blanks, signs, hex, exponents; plain decimals pass" '
    { BMT_TIMEOUT=soon $PROGS/hello 2>err; rc=$?; } && test $rc -ne 0 &&
    grep -q "bmt_init: BMT_TIMEOUT=.soon. is not a positive number of seconds (a plain decimal, such as 300 or 2.5)" err &&
    for v in " 5" "+5" 0x10 1e3 . 0 0.0; do
        { BMT_TIMEOUT="$v" $PROGS/hello 2>err; rc=$?; } && test $rc -ne 0 &&
            grep -q "BMT_TIMEOUT=.$v. is not a positive number of seconds" err || { echo "BMT_TIMEOUT=[$v]: $rc"; cat err; return 1; }
    done &&
    for v in 5 2.5 .5 7.; do BMT_TIMEOUT=$v $PROGS/hello >/dev/null || return 1; done &&
    { BMT_PEAK_TFLOPS=+1 $PROGS/hello 2>err; rc=$?; } && test $rc -ne 0 &&
    grep -q "BMT_PEAK_TFLOPS=.+1. is not a positive number" err
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

test_expect_success "ranks that disagree on BMT_CHECK_COLLECTIVES fail bmt_init alike, naming the first that differs" '
    # the none backend moves nothing: before, the job ran to the end with one
    # rank checking every collective and the others not (with nccl: a check
    # paired with a real collective)
    { with_timeout 60 $BMLAUNCH --metrics-port 0 -n 3 -- \
        sh -c "test \$BMT_RANK != 2 || export BMT_CHECK_COLLECTIVES=1; exec $PROGS/bootcheck" >out 2>err; rc=$?; } &&
    test $rc -eq 1 && ! grep -q "every peer" out &&
    grep -qE "^[0-2]: bootcheck: rank [0-2]: the ranks disagree on BMT_CHECK_COLLECTIVES: rank 2 has 1, rank 0 0; set it alike on every rank" err
'

test_expect_success "ranks that disagree on the backend fail bmt_init, naming it, before any communicator" '
    { with_timeout 60 $BMLAUNCH --metrics-port 0 -n 2 --timeout 30 -- \
        sh -c "test \$BMT_RANK = 0 || export BMT_BACKEND=none; exec $PROGS/hello" >out 2>err; rc=$?; } &&
    test $rc -eq 1 && ! grep -q "moves no data" err && ! grep -q "timed out" err &&
    grep -qE "^[01]: hello: rank [01]: the ranks disagree on the backend: rank 1 uses none, rank 0 shm; set BMT_BACKEND \(or bmt_config_t.backend\) alike on every rank" err
'

test_expect_success "cuda: a rank whose PMIx local rank is not the one the layout gives it is refused before it picks a GPU" '
    # 2 logical nodes of 2 on one machine: ranks 2 and 3 are PMIx local ranks 2
    # and 3, but the layout would give them cuda:0 and cuda:1, the GPUs of
    # ranks 0 and 1 (those two wait, so that the refusal is what ends the job)
    { with_timeout 60 $BMLAUNCH --metrics-port 0 -n 4 --gpus-per-node 2 -- \
        sh -c "test \$BMT_RANK -ge 2 || exec sleep 30; BMT_DEVICE=cuda exec $PROGS/hello" >out 2>err; rc=$?; } &&
    test $rc -eq 1 &&
    grep -qE "^[23]: hello: rank ([23]): PMIx places it as local rank \1 of 4 on .*, but the layout \(2 ranks per node\) makes it local rank [01] and would give it cuda:[01]" err
'

test_expect_success "BMT_FAULT naming no rank of the job, or with signs or blanks, is refused, not ignored" '
    { BMT_FAULT=step:2:1 with_timeout 60 $BMLAUNCH --metrics-port 0 -n 2 -- $PROGS/hello >out 2>err; rc=$?; } &&
    test $rc -eq 1 && grep -q "BMT_FAULT=.step:2:1. names rank 2, but the job has ranks 0 to 1 only" err &&
    # 2^32 is no rank (the old sscanf %d made it rank 0)
    { BMT_FAULT=step:4294967296:1 $PROGS/hello >out 2>err; rc=$?; } && test $rc -eq 1 &&
    grep -q "names rank 4294967296, but the job has ranks 0 to 0 only" err &&
    for f in step:+1:1 "save: 1:2" nan:1:+2 step:1:99999999999999999999 step:1 boom:0:1; do
        { BMT_FAULT=$f $PROGS/hello >out 2>err; rc=$?; } && test $rc -eq 1 &&
        grep -q "BMT_FAULT=.$f.: use step:RANK:STEP" err || { echo "BMT_FAULT=$f was taken"; exit 1; }
    done &&
    BMT_FAULT=step:0:1 BMT_RESTART=0 $PROGS/hello >out &&
    { BMT_FAULT=step:0:1 BMT_RESTART=one $PROGS/hello >out 2>err; rc=$?; } && test $rc -eq 1 &&
    grep -q "BMT_RESTART=.one. is not a count" err
'

test_expect_success "BMT_SHM_CHUNK with a blank or a sign before its digits is refused (\" -1\" wrapped around)" '
    for v in " -18446744073709551615" " -1" "+1M" " 4096"; do
        { BMT_SHM_CHUNK="$v" with_timeout 60 $BMLAUNCH --metrics-port 0 -n 2 -- $PROGS/hello >out 2>err; rc=$?; } &&
        test $rc -eq 1 && grep -q "BMT_SHM_CHUNK=.$v. is not a byte count" err ||
        { echo "BMT_SHM_CHUNK=\"$v\" was taken"; cat err; exit 1; }
    done
'

test_done
