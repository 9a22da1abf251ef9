#!/bin/bash
# PyTorch jobs under bmlaunch (issue 22): an unmodified torch.distributed program
# (tests/progs/torch_env.py, /usr/bin/python3 with Debian's python3-torch, gloo on
# CPU) gets torchrun's environment, so init_process_group() with the default
# env:// works; supervision, exit codes, the failure summary, --log-dir and
# --max-restarts behave as for libbmt programs. torch's import takes seconds on
# a small machine: each launch checks as much as it can.
. "$(dirname "$0")/lib.sh"

PY=/usr/bin/python3
TORCH_ENV=$SRC/tests/progs/torch_env.py
export PY TORCH_ENV

if ! $PY -c "import torch.distributed as d; assert d.is_gloo_available()" 2>"$TMP/torch.err"; then
    sed 's/^/# /' "$TMP/torch.err" | tail -3
    test_expect_success "$PY has torch with gloo (make deps installs python3-torch)" 'false'
    test_done
    exit
fi

# torch_line RANK FILE: what rank RANK of torch_env.py printed about itself.
torch_line() {
    grep "^$1: torch_env: rank $1 of " "$2"
}
export -f torch_line

test_expect_success "2 x 2 on cpu: env:// init, all-reduce over world, group and replica; torchrun's variables match the BMT_ layout; stale ones are replaced" '
    RANK=99 WORLD_SIZE=1 MASTER_PORT=1 TORCHELASTIC_USE_AGENT_STORE=True \
        with_timeout 240 $BMLAUNCH --metrics-port 0 -g 2 -n 2 --device cpu -- $PY $TORCH_ENV >out 2>err &&
    torch_line 0 out | grep -q "sums world 10 group 3 replica 4; hosts [^;]*; restart 0; master 127.0.0.1:[0-9]*; gloo on cpu\$" &&
    torch_line 1 out | grep -q "sums world 10 group 3 replica 6;" &&
    torch_line 2 out | grep -q "sums world 10 group 7 replica 4;" &&
    torch_line 3 out | grep -q "sums world 10 group 7 replica 6;" &&
    test $(grep -o "master 127.0.0.1:[0-9]*;" out | sort -u | wc -l) -eq 1 &&
    ! grep -q "job failed" err
'

test_expect_success "the environment of a rank is torchrun's (RANK, LOCAL_WORLD_SIZE, GROUP_RANK, ...), and libbmt's BMT_ set is unchanged" '
    env -u OMP_NUM_THREADS $BMLAUNCH --metrics-port 0 -g 2 -n 2 -- sh -c "env | sort" >env.out &&
    for v in RANK=2 WORLD_SIZE=4 LOCAL_RANK=2 LOCAL_WORLD_SIZE=4 GROUP_RANK=0 NODE_RANK=0 \
        GROUP_WORLD_SIZE=1 ROLE_RANK=2 ROLE_WORLD_SIZE=4 ROLE_NAME=default MASTER_ADDR=127.0.0.1 \
        TORCHELASTIC_RESTART_COUNT=0 TORCHELASTIC_MAX_RESTARTS=0; do
        grep -qx "2: $v" env.out || { echo "rank 2 lacks $v"; exit 1; }
    done &&
    grep -qx "2: TORCHELASTIC_RUN_ID=$(sed -n "s/^2: BMT_JOB_ID=//p" env.out)" env.out &&
    ! grep -q "TORCHELASTIC_USE_AGENT_STORE\|OMP_NUM_THREADS" env.out &&
    $BMLAUNCH --metrics-port 0 -g 2 -n 2 -- $PROGS/behave env >bmt.out &&
    test "$(grep -c ": BMT_" bmt.out)" -eq "$(grep -c ": BMT_" env.out)"
'

test_expect_success "a Python exception on rank 1: exit 1, the summary names rank 1 and shows the traceback's last line; --log-dir keeps it" '
    mkdir logs &&
    { with_timeout 240 $BMLAUNCH --metrics-port 0 --log-dir logs --tee -g 2 -n 2 -- $PY $TORCH_ENV --fail 1 >out 2>err; rc=$?; } &&
    test $rc -eq 1 &&
    grep -q "^bmlaunch: job failed: rank 1 (pid [0-9]* on .*) exited with code 1\$" err &&
    grep -q "^    1: RuntimeError: torch_env: rank 1 fails on purpose\$" err &&
    grep -q "^    1: Traceback (most recent call last):\$" err &&
    # the others wait in gloo: the SIGTERM of bmlaunch usually ends them, but
    # on a loaded machine gloo may see the socket of rank 1 close first (they
    # then fail on their own); either way the summary accounts for them
    grep -Eq "^bmlaunch: of the 3 other ranks still running: .*(ended on SIGTERM|failed on their own)" err &&
    grep -q "^RuntimeError: torch_env: rank 1 fails on purpose\$" logs/rank-1.log
'

test_expect_success "sys.exit(7) on rank 3: exit 7, the summary names rank 3" '
    { with_timeout 240 $BMLAUNCH --metrics-port 0 -g 2 -n 2 -- $PY $TORCH_ENV --fail 3 --code 7 >out 2>err; rc=$?; } &&
    test $rc -eq 7 &&
    grep -q "^bmlaunch: job failed: rank 3 (pid [0-9]* on .*) exited with code 7\$" err &&
    grep -q "^    3: torch_env: rank 3: sys.exit(7)\$" err
'

test_expect_success "--max-restarts 1: rank 1 fails once, every rank starts again with TORCHELASTIC_RESTART_COUNT=1, the job exits 0" '
    with_timeout 300 $BMLAUNCH --metrics-port 0 --max-restarts 1 -g 2 -n 2 -- $PY $TORCH_ENV --fail 1 --fail-until 1 >out 2>err &&
    grep -q "^bmlaunch: restart 1 of 1 after rank 1 (pid [0-9]* on .*) exited with code 1\$" err &&
    for r in 0 1 2 3; do
        test "$(torch_line $r out | sed "s/.*; restart \([0-9]*\);.*/\1/" | tr "\n" " ")" = "0 1 " ||
            { echo "rank $r:"; torch_line $r out; exit 1; }
    done &&
    test $(grep -o "restart [01]; master .*" out | sort -u | wc -l) -eq 2 &&
    grep -q "^bmlaunch: 1 restart made (--max-restarts 1)\$" err && ! grep -q "job failed" err
'

test_done
