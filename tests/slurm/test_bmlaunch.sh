#!/bin/bash
# bmlaunch under a real Slurm cluster (tests/slurm/cluster.sh: slurmctld, slurmd and
# munge of our own, one node, then two nodes in network namespaces): the ranks run
# through srun --mpi=pmix, the summary and exit codes are those of local mode, the
# rendered batch script runs under sbatch --wait, scancel ends every rank, a
# requeued job resumes from its checkpoint; layouts the allocation cannot take
# and `srun bmlaunch` are refused before srun; the collector counts the failed
# ranks srun reports; across two nodes the metrics pushes travel over HTTPS only.
. "$(dirname "$0")/../integration/lib.sh"
. "$(dirname "$0")/cluster.sh"

slurm_start one 64
rc=$?
if [ $rc -eq 77 ]; then
    echo "# skipped: this machine cannot run a private Slurm cluster (see above)"
    test_expect_success "a private Slurm cluster can start here (root, slurm-wlm, munge)" 'false'
    test_done
    exit
elif [ $rc -ne 0 ]; then
    test_expect_success "the one-node Slurm cluster starts" 'false'
    test_done
    exit
fi
NODE=$SLURM_TEST_NODES
export NODE

test_expect_success "collectives 2x2 through srun inside salloc (shm on one node)" '
    with_timeout 120 salloc -N1 -n4 $BMLAUNCH -v -g 2 -n 2 --timeout 60 -- $PROGS/collcheck --quick >out 2>err &&
    test $(grep -c "checks passed on world(4), group(2), replica(2)" out) -eq 4 &&
    grep -q "srun --mpi=pmix --nodes=1 --ntasks=4 --ntasks-per-node=4 --distribution=block --job-name=bmlaunch\.[0-9]*\.0 --label" err &&
    ! grep -q -- "--kill-on-bad-exit" err
'

test_expect_success "each task gets the same BMT_ variables as a local rank" '
    with_timeout 60 salloc -N1 -n4 $BMLAUNCH -g 2 -n 2 -- $PROGS/behave env >slurm.env 2>err &&
    $BMLAUNCH -g 2 -n 2 -- $PROGS/behave env >local.env &&
    for v in BMT_RANK BMT_GROUP BMT_GROUP_RANK BMT_LOCAL_RANK BMT_NODE BMT_GROUPS BMT_GPUS_PER_GROUP BMT_WORLD_SIZE; do
        test "$(grep ": $v=" slurm.env | sort)" = "$(grep ": $v=" local.env | sort)" || { echo "$v differs"; exit 1; }
    done &&
    grep -q "^0: BMT_JOB_ID=slurm\\." slurm.env
'

# slurmstepd sends output in messages of at most 1024 bytes; srun --label prints
# each as a line. bmlaunch joins the pieces (supervise.c, SRUN_PIECE), so a
# rank's lines are the same as under local bmlaunch: long lines, lines written
# in pieces, lines cut by block-buffered writes, on stdout and stderr.
test_expect_success "every line arrives whole and alone, as locally: 1022-70000 bytes, written in pieces or in blocks" '
    with_timeout 60 salloc -N1 -n2 $BMLAUNCH -n 2 -- /usr/bin/python3 $SRC/tests/progs/lines.py >slurm.out 2>slurm.err &&
    $BMLAUNCH -n 2 -- /usr/bin/python3 $SRC/tests/progs/lines.py >local.out 2>local.err &&
    for r in 0 1; do
        for s in out err; do
            grep "^$r: " local.$s >l && grep "^$r: " slurm.$s >s &&
            test $(wc -l <l) -ge 190 && cmp l s ||
                { echo "rank $r std$s differs:"; diff l s | cut -c1-100 | head -20; exit 1; }
        done
    done &&
    grep -qx "0: 0 out tail without newline" slurm.out &&
    grep -qx "1: pieces: RuntimeError: the message" slurm.err
'

test_expect_success "a rank exits 3: exit 3, the summary names it and its last lines, no rank left" '
    mkdir pids; export BEHAVE_PIDDIR=$PWD/pids
    { with_timeout 60 salloc -N1 -n4 $BMLAUNCH -g 2 -n 2 -- $PROGS/behave --rank 2 exit 3 >out 2>err; rc=$?; } &&
    test $rc -eq 3 &&
    grep -q "bmlaunch: job failed: rank 2 (on $NODE) exited with code 3" err &&
    grep -q "^    2: rank 2: exiting with 3" err &&
    test $(ls pids | wc -l) -eq 4 && sleep 1 && no_survivors pids
'

test_expect_success "a rank killed by SIGKILL: exit 137 and the summary names it" '
    { with_timeout 60 salloc -N1 -n4 $BMLAUNCH -n 4 -- $PROGS/behave --rank 1 signal 9 >out 2>err; rc=$?; } &&
    test $rc -eq 137 && grep -q "job failed: rank 1 (on $NODE) was killed by signal 9 (SIGKILL)" err
'

test_expect_success "PMIx_Abort from a rank: its status and message" '
    { with_timeout 60 salloc -N1 -n4 $BMLAUNCH -n 4 -- $PROGS/behave --rank 3 abort 42 "loss is NaN" >out 2>err; rc=$?; } &&
    test $rc -eq 42 &&
    grep -q "job failed: rank 3 called PMIx_Abort with status 42: loss is NaN" err
'

test_expect_success "SIGTERM to bmlaunch reaches every task; exit 143; no rank left" '
    mkdir pids; export BEHAVE_PIDDIR=$PWD/pids
    salloc -N1 -n4 $BMLAUNCH -n 4 -- $PROGS/behave --rank 99 sleep 1 >out 2>err & spid=$!
    for i in $(seq 100); do [ $(ls pids | wc -l) -eq 4 ] && break; sleep 0.1; done &&
    test $(ls pids | wc -l) -eq 4 &&
    pkill -TERM -f "^$BMLAUNCH -n 4 -- $PROGS/behave --rank 99" &&
    { wait $spid; rc=$?; } && test $rc -eq 143 &&
    grep -q "bmlaunch: received SIGTERM; forwarding it to every task of the job step" err &&
    grep -q "the job was ended by SIGTERM sent to bmlaunch" err &&
    sleep 1 && no_survivors pids
'

# sigjob SIGNALS GRACE RANKS BMLAUNCH-ARGS...: run inside an allocation (salloc
# ... bash -c "sigjob ..."), whose shell outlives bmlaunch: start bmlaunch --grace
# GRACE ARGS (the program: behave catch S), wait until RANKS ranks wait for a
# signal, send bmlaunch each of SIGNALS ("TERM", or "INT INT": the second once
# every rank has its first), then record while the allocation still runs:
# Polls URL (an /api/status, curl's options after it) into s.json until the
# job's state is ended, at most N tenths of a second (first argument).
until_ended() {
    local n=$1 url=$2 i
    shift 2
    for i in $(seq $n); do
        curl -sf "$@" "$url" >s.json && grep -q "\"state\":\"ended\"" s.json && break
        sleep 0.1
    done
    return 0
}

# bmlaunch's exit status (rc), the seconds from the first signal to its end
# (secs), the job's steps left (steps: none may survive bmlaunch) and whether a
# rank process is still alive (survivors).
sigjob() {
    local sigs=$1 grace=$2 n=$3 i s t0 first=1
    shift 3
    $BMLAUNCH --grace "$grace" "$@" >out 2>err &
    local b=$!
    for i in $(seq 300); do [ "$(grep -c "waiting for a signal" out)" -ge "$n" ] && break; sleep 0.1; done
    t0=$(date +%s.%N)
    for s in $sigs; do
        if [ $first = 0 ]; then
            for i in $(seq 300); do [ "$(grep -c ": got SIG" out)" -ge "$n" ] && break; sleep 0.1; done
        fi
        kill -"$s" $b
        first=0
    done
    wait $b
    echo $? >rc
    awk -v a="$(date +%s.%N)" -v b="$t0" "BEGIN { print a - b }" >secs
    for i in $(seq 150); do squeue -h -s -j "$SLURM_JOB_ID" -o "%i %j" | grep -q bmlaunch || break; sleep 0.1; done
    squeue -h -s -j "$SLURM_JOB_ID" -o "%i %j" | grep bmlaunch >steps
    for i in $(seq 20); do no_survivors pids 2>survivors && break; sleep 0.25; done
    # What a failing test shows (the harness prints a failing body's stderr).
    echo "sigjob: rc $(cat rc), $(cat secs) s, steps left: $(cat steps), survivors: $(cat survivors)" >&2
    tail -5 err >&2
}
export -f sigjob no_survivors

test_expect_success "SIGTERM under srun reaches every task as SIGTERM with its grace; tasks that exit 0 then: exit 0 (as locally); no step or rank left" '
    mkdir pids && export BEHAVE_PIDDIR=$PWD/pids &&
    with_timeout 90 salloc -N1 -n4 bash -c "sigjob TERM 20 4 -g 2 -n 2 -- $PROGS/behave catch 1" &&
    test $(grep -c "^[0-3]: rank [0-3]: got SIGTERM$" out) -eq 4 &&
    test $(grep -c "^[0-3]: rank [0-3]: handled$" out) -eq 4 &&
    test ! -s steps && test ! -s survivors &&
    test "$(cat rc)" = 0 && ! grep -q "job failed" err
'

test_expect_success "SIGINT under srun reaches every task as SIGINT (not a status request)" '
    mkdir pids && export BEHAVE_PIDDIR=$PWD/pids &&
    with_timeout 90 salloc -N1 -n4 bash -c "sigjob INT 20 4 -n 4 -- $PROGS/behave catch 0.5" &&
    test "$(cat rc)" = 0 &&
    test $(grep -c "^[0-3]: rank [0-3]: got SIGINT$" out) -eq 4 &&
    test $(grep -c "^[0-3]: rank [0-3]: handled$" out) -eq 4 &&
    test ! -s steps && test ! -s survivors
'

test_expect_success "a task slower than --grace is SIGKILLed when it ends, not before; no step or rank left" '
    mkdir pids && export BEHAVE_PIDDIR=$PWD/pids &&
    with_timeout 90 salloc -N1 -n4 bash -c "sigjob TERM 3 4 -n 4 -- $PROGS/behave catch 1000" &&
    test "$(cat rc)" = 143 && test $(grep -c ": got SIGTERM$" out) -eq 4 &&
    awk "{ exit !(\$1 >= 3 && \$1 < 15) }" secs &&
    ! grep -q ": handled$" out && test ! -s steps && test ! -s survivors
'

test_expect_success "a second SIGINT kills every task at once; exit 130; no step or rank left" '
    mkdir pids && export BEHAVE_PIDDIR=$PWD/pids &&
    with_timeout 90 salloc -N1 -n4 bash -c "sigjob \"INT INT\" 60 4 -n 4 -- $PROGS/behave catch 1000" &&
    test "$(cat rc)" = 130 && test $(grep -c ": got SIGINT$" out) -eq 4 &&
    grep -q "bmlaunch: second SIGINT: killing every rank now" err &&
    awk "{ exit !(\$1 < 20) }" secs &&
    test ! -s steps && test ! -s survivors
'

test_expect_success "bmlaunch killed by SIGKILL: srun (told by PR_SET_PDEATHSIG) cancels the step; no step or rank left" '
    mkdir pids && export BEHAVE_PIDDIR=$PWD/pids &&
    with_timeout 90 salloc -N1 -n4 bash -c "sigjob KILL 60 4 -n 4 -- $PROGS/behave catch 1000" &&
    test "$(cat rc)" = 137 && test ! -s steps && test ! -s survivors
'

test_expect_success "a rank that fails: the others get SIGTERM and the grace, as locally (srun -K would SIGKILL them)" '
    mkdir pids && export BEHAVE_PIDDIR=$PWD/pids &&
    { with_timeout 90 salloc -N1 -n4 $BMLAUNCH --grace 20 -n 4 -- $PROGS/behave catch 1 2 3 >out 2>err; rc=$?; } &&
    test $rc -eq 3 && grep -q "bmlaunch: job failed: rank 2 (on $NODE) exited with code 3" err &&
    test $(grep -c "^[013]: rank [013]: got SIGTERM$" out) -eq 3 &&
    test $(grep -c "^[013]: rank [013]: handled$" out) -eq 3 &&
    sleep 1 && no_survivors pids
'

# srun reads settings from the environment too (SLURM_WAIT is srun -W,
# SLURM_STDOUTMODE srun -o, ...): those that would undo bmlaunch's srun line stay
# out of srun's environment, so the others still get their grace (not srun's
# SIGKILL one second after the first task ended) and the output still reaches
# bmlaunch (not files of srun's).
test_expect_success "srun settings in the caller's environment (SLURM_WAIT, SLURM_STDOUTMODE) do not undo bmlaunch's srun line" '
    mkdir pids && export BEHAVE_PIDDIR=$PWD/pids &&
    { SLURM_WAIT=1 SLURM_STDOUTMODE=$PWD/lost-%t.out SLURM_UNBUFFEREDIO=1 with_timeout 90 salloc -N1 -n4 \
        $BMLAUNCH --grace 20 -n 4 -- $PROGS/behave catch 1 2 3 >out 2>err; rc=$?; } &&
    test $rc -eq 3 && grep -q "bmlaunch: job failed: rank 2 (on $NODE) exited with code 3" err &&
    test $(grep -c "^[013]: rank [013]: got SIGTERM$" out) -eq 3 &&
    test $(grep -c "^[013]: rank [013]: handled$" out) -eq 3 &&
    ! grep -q "Killed" err && test -z "$(ls lost-* 2>/dev/null)" &&
    sleep 1 && no_survivors pids
'

# After a stop, as in local mode: a task that exits non-zero on its own (its
# clean-up failed) has failed, and the job's status and summary say so; tasks
# that srun SIGKILLs because bmlaunch had to signal srun itself (scancel
# failing here) were stopped. bmlaunch once took every task report after a
# stop for the stop's doing: exit 143, the failed clean-up unnamed.
cat >"$TMP/cleanup.sh" <<'EOF'
if [ "$BMT_RANK" = 2 ]; then trap 'echo "rank 2: cleanup failed"; exit 5' TERM
else trap 'echo "rank $BMT_RANK: handled"; exit 0' TERM; fi
echo $$ >"$BEHAVE_PIDDIR/pid.$BMT_RANK"
echo "rank $BMT_RANK: waiting for a signal"
while :; do sleep 0.1; done
EOF
test_expect_success "SIGTERM under srun, a task whose clean-up fails: its exit code and the summary name it, as locally" '
    mkdir pids && export BEHAVE_PIDDIR=$PWD/pids &&
    with_timeout 90 salloc -N1 -n4 bash -c "sigjob TERM 20 4 -n 4 -- sh $TMP/cleanup.sh" &&
    test "$(cat rc)" = 5 && test $(grep -c "^[013]: rank [013]: handled$" out) -eq 3 &&
    grep -q "^bmlaunch: job failed: rank 2 (on $NODE) exited with code 5\$" err &&
    grep -qx "    2: rank 2: cleanup failed" err &&
    grep -qx "bmlaunch: the job was ended by SIGTERM sent to bmlaunch" err &&
    test ! -s steps && test ! -s survivors
'

test_expect_success "SIGTERM when scancel fails: srun SIGKILLs the tasks for bmlaunch; exit 143, no rank failed" '
    mkdir pids fake && export BEHAVE_PIDDIR=$PWD/pids &&
    printf "#!/bin/sh\necho scancel refuses on purpose >&2\nexit 1\n" >fake/scancel && chmod +x fake/scancel &&
    PATH=$PWD/fake:$PATH with_timeout 90 salloc -N1 -n4 bash -c "sigjob TERM 20 4 -n 4 -- $PROGS/behave catch 1000" &&
    test "$(cat rc)" = 143 && grep -q "scancel refuses on purpose; sending SIGTERM to srun instead" err &&
    grep -q "tasks 0-3: Killed" err && ! grep -q "job failed" err &&
    grep -qx "bmlaunch: the job was ended by SIGTERM sent to bmlaunch" err &&
    test ! -s steps && test ! -s survivors
'

test_expect_success "a layout that does not fit the allocation: exit 2 and what to ask for" '
    { with_timeout 60 salloc -N1 -n4 $BMLAUNCH -g 2 -n 4 --gpus-per-node 4 -- $PROGS/behave env >out 2>err; rc=$?; } &&
    test $rc -eq 2 &&
    grep -q "8 ranks (2 x 4) on nodes of 4 need 2 nodes, but allocation [0-9]* has 1; ask for more nodes or fewer ranks" err &&
    ! grep -q "BMT_RANK" out
'

# The allocation's tasks a node (salloc -n 8) are the ranks a node when
# --gpus-per-node does not say: the refusal says where its 8 came from.
test_expect_success "an allocation of more tasks than ranks: exit 2, naming SLURM_TASKS_PER_NODE as where the ranks a node came from" '
    { with_timeout 60 salloc -N1 -n8 $BMLAUNCH -n 4 -- $PROGS/behave env >out 2>err; rc=$?; } &&
    test $rc -eq 2 &&
    grep -q "bmlaunch: allocation [0-9]* has 8 tasks a node (SLURM_TASKS_PER_NODE), the ranks a node unless --gpus-per-node says otherwise: 4 ranks (1 x 4) do not fill whole nodes of 8" err &&
    ! grep -q BMT_RANK out &&
    with_timeout 60 salloc -N1 -n8 $BMLAUNCH -n 4 --gpus-per-node 4 -- $PROGS/behave env >out 2>err &&
    test $(grep -c ": BMT_RANK=" out) -eq 4
'

# One task a GPU and no --overcommit: srun needs a CPU for each task, and
# refused the step itself ("More processors requested than permitted", exit
# 1) after bmlaunch had planned it.
test_expect_success "--device cuda, more ranks a node than the allocation has CPUs: exit 2 before srun, and what to ask for" '
    { with_timeout 60 salloc -N1 -n2 $BMLAUNCH --device cuda -n 4 --gpus-per-node 4 -- $PROGS/behave env >out 2>err; rc=$?; } &&
    test $rc -eq 2 &&
    grep -q "bmlaunch: 4 ranks a node (one task a GPU) need 4 CPUs a node, but the nodes of allocation [0-9]* have 2; ask Slurm for --ntasks-per-node 4 (or 4 CPUs a node), or give fewer ranks a node" err &&
    ! grep -q "^srun" err && ! grep -q BMT_RANK out
'

# `srun bmlaunch ...` (as one writes `srun torchrun ...`): every task was a
# bmlaunch whose own srun waited for the step's CPUs for ever ("step creation
# temporarily disabled, retrying"), until the job's time limit.
test_expect_success "bmlaunch started by srun (a task of a job step): exit 2 at once, naming the step; --local still runs there" '
    { with_timeout 60 salloc -N1 -n4 srun -n 2 $BMLAUNCH -n 2 -- $PROGS/hello >out 2>err; rc=$?; } &&
    { test $rc -eq 2 &&
        test $(grep -c "^bmlaunch: bmlaunch runs as a task of job step [0-9]*\.0 (srun started it), but it starts the ranks with srun itself" err) -eq 2 &&
        grep -q "run bmlaunch in the batch script or the salloc shell itself, not under srun, or give --local" err &&
        ! grep -q "step creation" err || { echo "exit $rc"; cat err; false; }; } &&
    with_timeout 60 salloc -N1 -n2 srun -n 1 $BMLAUNCH --local -n 2 -- $PROGS/hello >out 2>err &&
    test $(grep -c "sums of ranks" out) -eq 2
'

# The collector learns a rank's end from srun's report of it, as it learns a
# local rank's from waitpid: bmt_ranks_failed, the rank's code and node, a
# rank_failed event (the BmtRankFailed alert). It said 0 failed ranks here.
test_expect_success "a rank that fails under srun is a failed rank on /metrics and /api/status too; the ranks bmlaunch ended are not" '
    port=$(free_port) &&
    { with_timeout 60 salloc -N1 -n4 $BMLAUNCH --metrics-port $port --metrics-linger 8 -n 4 -- \
        $PROGS/behave --rank 2 exit 3 >out 2>err & }
    job=$!
    until_ended 300 "http://127.0.0.1:$port/api/status"
    curl -sf "http://127.0.0.1:$port/metrics" >m.txt
    rc=0; wait $job || rc=$?
    test $rc -eq 3 && grep -q "^bmlaunch: job failed: rank 2 (on $NODE) exited with code 3\$" err &&
    grep -q "^bmt_ranks_failed{job_id=\"slurm\.[0-9]*\"} 1\$" m.txt &&
    grep -q "^bmt_ranks_failed_total{job_id=\"slurm\.[0-9]*\"} 1\$" m.txt &&
    grep -q "^bmt_rank_exit_code{job_id=\"slurm\.[0-9]*\",rank=\"2\",host=\"$NODE\"} 3\$" m.txt &&
    /usr/bin/python3 -c "
import json
s = json.load(open(\"s.json\"))
assert s[\"exit_status\"] == 3, s[\"exit_status\"]
assert s[\"failed_ranks\"] == [{\"rank\": 2, \"host\": \"$NODE\", \"exit_code\": 3}], s[\"failed_ranks\"]
ev = [e for e in s[\"events\"] if e[\"kind\"] == \"rank_failed\"]
assert [e[\"detail\"] for e in ev] == [\"rank 2 (on $NODE) exited with code 3\"], ev
" || { cat m.txt | grep -E "failed|exit"; cat s.json; false; }
'

test_expect_success "ranks that fail alike (srun: \"tasks 0-3: Exited with exit code 3\") are each a failed rank on /api/status" '
    port=$(free_port) &&
    { with_timeout 60 salloc -N1 -n4 $BMLAUNCH --metrics-port $port --metrics-linger 8 -n 4 -- \
        $PROGS/behave exit 3 >out 2>err & }
    job=$!
    until_ended 300 "http://127.0.0.1:$port/api/status"
    rc=0; wait $job || rc=$?
    test $rc -eq 3 && grep -q "^srun: error: $NODE: tasks [0-9,-]*: Exited with exit code 3\$" err &&
    /usr/bin/python3 -c "
import json
s = json.load(open(\"s.json\"))
assert s[\"ranks_failed\"] == 4 and s[\"ranks_failed_total\"] == 4, s[\"ranks_failed\"]
assert sorted(f[\"rank\"] for f in s[\"failed_ranks\"]) == [0, 1, 2, 3], s[\"failed_ranks\"]
assert all(f[\"exit_code\"] == 3 and f[\"host\"] == \"$NODE\" for f in s[\"failed_ranks\"]), s
" || { cat err s.json; false; }
'

test_expect_success "--local inside an allocation runs on this machine, bmlaunch as the PMIx server" '
    with_timeout 60 salloc -N1 -n2 $BMLAUNCH --local -v -n 2 -- $PROGS/hello >out 2>err &&
    grep -q "PMIx namespace bmlaunch\\." err && ! grep -q "srun --mpi" err &&
    test $(grep -c "sums of ranks" out) -eq 2
'

test_expect_success "the rendered batch script runs under sbatch --wait; output per rank" '
    $BMLAUNCH --sbatch -g 2 -n 2 --gpus-per-node 4 --time 00:05:00 --job-name bmtjob \
        --output "$PWD/job-%j.out" --log-dir "$PWD/logs-%j" --tee -- $PROGS/hello >job.sbatch &&
    with_timeout 90 sbatch --wait job.sbatch >submitted &&
    id=$(awk "/Submitted batch job/ {print \$4}" submitted) && test -n "$id" &&
    test $(grep -c "sums of ranks: world 6" job-$id.out) -eq 4 &&
    grep -q "^3: rank 3 of 4 on $NODE" job-$id.out &&
    test $(ls logs-$id | wc -l) -eq 4 && grep -q "sums of ranks" logs-$id/rank-3.log
'

test_expect_success "--submit hands the script to sbatch" '
    $BMLAUNCH --sbatch --submit -g 1 -n 2 --gpus-per-node 2 --time 00:05:00 --output "$PWD/sub-%j.out" -- $PROGS/hello >submitted &&
    grep -qE "^Submitted batch job [0-9]+$" submitted &&
    id=$(awk "{print \$4}" submitted) &&
    for i in $(seq 100); do squeue -h -j $id 2>/dev/null | grep -q . || break; sleep 0.2; done &&
    test $(grep -c "sums of ranks" sub-$id.out) -eq 2
'

test_expect_success "scancel of a batch job ends every rank" '
    mkdir pids; export BEHAVE_PIDDIR=$PWD/pids
    $BMLAUNCH --sbatch -n 4 --gpus-per-node 4 --time 00:05:00 --output "$PWD/c-%j.out" -- \
        $PROGS/behave --rank 99 sleep 1 >long.sbatch &&
    id=$(sbatch --parsable long.sbatch) &&
    for i in $(seq 150); do [ $(ls pids | wc -l) -eq 4 ] && break; sleep 0.1; done &&
    test $(ls pids | wc -l) -eq 4 &&
    scancel $id &&
    for i in $(seq 100); do squeue -h -j $id 2>/dev/null | grep -q . || break; sleep 0.2; done &&
    sleep 1 && no_survivors pids
'

# What --signal=B:USR1@LEAD sends before the time limit: USR1 to the batch
# script alone (scancel --batch). The script execs bmlaunch, so bmlaunch gets it
# and srun forwards it: every rank gets it once; the job's exit code is the
# ranks' (bmlaunch's own), not a shell's.
cat >"$TMP/usr1.sh" <<'EOF'
n=0
trap 'n=$((n + 1)); echo "rank $BMT_RANK: got USR1 $n"' USR1
echo "rank $BMT_RANK: waiting for a signal"
while [ $n -eq 0 ]; do sleep 0.1; done
for i in 1 2 3 4 5 6 7 8 9 10; do sleep 0.1; done
exit 3
EOF
test_expect_success "USR1 to the batch script (--signal=B:USR1) reaches every rank once; the job's exit code is bmlaunch's" '
    $BMLAUNCH --sbatch -n 2 --gpus-per-node 2 --time 00:05:00 --output "$PWD/u-%j.out" -- \
        sh $TMP/usr1.sh >u.sbatch &&
    id=$(sbatch --parsable u.sbatch) &&
    for i in $(seq 150); do [ "$(grep -c "waiting for a signal" u-$id.out 2>/dev/null)" = 2 ] && break; sleep 0.1; done &&
    scancel --batch --signal=USR1 $id &&
    for i in $(seq 100); do squeue -h -j $id 2>/dev/null | grep -q . || break; sleep 0.2; done &&
    # both ranks exit 3 at about the same moment: srun names either first
    cat u-$id.out && test $(grep -c "^[01]: rank [01]: got USR1 1$" u-$id.out) -eq 2 &&
    ! grep -q "got USR1 2" u-$id.out &&
    grep -q "^bmlaunch: job failed: rank [01] (on $NODE) exited with code 3\$" u-$id.out &&
    scontrol show job -o $id | grep -q " ExitCode=3:0 "
'

# scontrol requeue (as preemption does) ends the job and runs its batch script
# again under the same job id: a new bmlaunch, whose runs count from 0 again
# (BMT_RESTART counts --max-restarts runs), while Slurm counts the requeues
# (SLURM_RESTART_COUNT). The trainer's --resume takes DIR/latest. sbatch
# --open-mode=append keeps the first run's output (Slurm truncates by default).
test_expect_success "scontrol requeue of a rendered batch job: the trainer resumes from --save-dir's latest; BMT_JOB_ID the same, BMT_RESTART 0 again, SLURM_RESTART_COUNT 1" '
    $BUILDDIR/bin/gpt2 --prepare $SRC/examples/gpt2/data/corpus.txt --out corpus >/dev/null &&
    $BMLAUNCH --sbatch -n 2 --gpus-per-node 2 --time 00:05:00 --output "$PWD/rq-%j.out" -- sh -c \
        "echo run BMT_JOB_ID=\$BMT_JOB_ID BMT_RESTART=\$BMT_RESTART SLURM_RESTART_COUNT=\${SLURM_RESTART_COUNT:-0}; exec $BUILDDIR/bin/gpt2 --data $PWD/corpus_train.bin --steps 1000000 --save-dir $PWD/S --save-every 10 --resume" >rq.sbatch &&
    id=$(sbatch --parsable --open-mode=append rq.sbatch) &&
    for i in $(seq 600); do [ -e S/latest ] && break; sleep 0.1; done && test -e S/latest &&
    scontrol requeue $id &&
    for i in $(seq 300); do squeue -h -j $id -t PD | grep -q . && break; sleep 0.1; done &&
    last=$(cat S/latest) && sleep 1 && test "$(cat S/latest)" = "$last" &&
    scontrol update jobid=$id StartTime=now &&
    for i in $(seq 600); do grep -q "gpt2: resumed from" rq-$id.out && break; sleep 0.1; done &&
    scancel $id &&
    for i in $(seq 100); do squeue -h -j $id | grep -q . || break; sleep 0.2; done &&
    grep -qx "0: run BMT_JOB_ID=slurm.$id BMT_RESTART=0 SLURM_RESTART_COUNT=0" rq-$id.out &&
    grep -qx "0: run BMT_JOB_ID=slurm.$id BMT_RESTART=0 SLURM_RESTART_COUNT=1" rq-$id.out &&
    grep -q "^0: gpt2: resumed from $PWD/S/$last (step [0-9]*)\$" rq-$id.out &&
    test $(grep -c "gpt2: resumed from" rq-$id.out) -eq 1 ||
        { cat rq-$id.out | grep -v "step  *[0-9]*/"; false; }
'

# --max-restarts under srun: each run is a new srun step with a fresh PMIx
# namespace and BMT_RESTART, as in local mode (tests/integration/test_restart.sh).
runs_of() { # rank file: the restarts that rank printed, in order
    sed -n "s/^$1: rank $1 restart \([0-9]*\)\$/\1/p" "$2" | tr '\n' ' ' | sed 's/ $//'
}
export -f runs_of

test_expect_success "--max-restarts 2 under srun: two failed runs, then every rank exits 0" '
    mkdir pids && export BEHAVE_PIDDIR=$PWD/pids &&
    with_timeout 120 salloc -N1 -n3 $BMLAUNCH -n 3 --max-restarts 2 -- $PROGS/behave --rank 1 fail-until 2 >out 2>err &&
    test $(grep -c "^bmlaunch: restart" err) -eq 2 &&
    grep -q "^bmlaunch: restart 2 of 2 after rank 1 (on $NODE) exited with code 1\$" err &&
    for r in 0 1 2; do test "$(runs_of $r out)" = "0 1 2" || { echo "rank $r saw $(runs_of $r out)"; exit 1; }; done &&
    grep -q "^bmlaunch: 2 restarts made (--max-restarts 2)\$" err &&
    ! grep -q "job failed" err && sleep 1 && no_survivors pids
'

test_expect_success "--max-restarts 1 under srun: the second failure ends the job with its summary" '
    mkdir pids && export BEHAVE_PIDDIR=$PWD/pids &&
    { with_timeout 120 salloc -N1 -n3 $BMLAUNCH -n 3 --max-restarts 1 -- $PROGS/behave --rank 1 fail-until 2 >out 2>err; rc=$?; } &&
    test $rc -eq 1 && test $(grep -c "^bmlaunch: restart" err) -eq 1 &&
    for r in 0 1 2; do test "$(runs_of $r out)" = "0 1" || exit 1; done &&
    grep -q "^bmlaunch: job failed: rank 1 (on $NODE) exited with code 1\$" err &&
    grep -q "^bmlaunch: 1 restart made (--max-restarts 1); none left\$" err &&
    sleep 1 && no_survivors pids
'

test_expect_success "1000 ranks (40 x 25) bootstrap under srun on one node" '
    with_timeout 300 salloc -N1 -n1000 --overcommit $BMLAUNCH -g 40 -n 25 --timeout 120 -- $PROGS/bootcheck >out 2>err &&
    grep -q "^0: bootcheck: rank 0: 1000 ranks (40 x 25) on 1 host" out
'

slurm_stop
stopped_one=$?
stopped_two=0

slurm_start two 64
rc=$?
if [ $rc -eq 77 ]; then
    echo "# skipped: no rights for network namespaces here; the two-node tests need them"
elif [ $rc -ne 0 ]; then
    test_expect_success "the two-node Slurm cluster starts" 'false'
else
    test_expect_success "two nodes: every peer's placement and communicators check out across them" '
        with_timeout 120 salloc -N2 --ntasks-per-node=2 $BMLAUNCH -g 2 -n 2 -- $PROGS/bootcheck --all >out 2>err &&
        test $(grep -c "bootcheck: rank [0-3]: 4 ranks (2 x 2) on 2 hosts node1,node2; every peer" out) -eq 4
    '
    test_expect_success "two nodes: groups across nodes, 4 ranks per node (2 x 4 on 2 x 4)" '
        with_timeout 120 salloc -N2 --ntasks-per-node=4 $BMLAUNCH -g 2 -n 4 -- $PROGS/behave env >out 2>err &&
        grep -qx "5: BMT_NODE=1" out && grep -qx "5: BMT_LOCAL_RANK=1" out && grep -qx "5: BMT_GROUP=1" out
    '
    # Pushes from the nodes cross the cluster's bridge to bmlaunch's address on it:
    # sniff.py BRIDGE PORT counts the TCP segments to PORT on the bridge, the TLS
    # records among them and any with clear-text HTTP or a bearer token, into
    # sniff.txt once ./stop exists.
    cat >"$TMP/sniff.py" <<-'EOF'
	import os, socket, sys
	br, port = sys.argv[1], int(sys.argv[2]).to_bytes(2, "big")
	s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
	s.bind((br, 0)); s.settimeout(0.2)
	open("sniffing", "w").close()
	seen = tls = clear = 0
	while not os.path.exists("stop"):
	    try:
	        f = s.recv(65535)
	    except socket.timeout:
	        continue
	    if len(f) < 54 or f[12:14] != b"\x08\x00" or f[23] != 6:
	        continue
	    t = 14 + (f[14] & 15) * 4
	    data = f[t + (f[t + 12] >> 4) * 4:]
	    if f[t + 2:t + 4] != port or not data:
	        continue
	    seen += 1
	    tls += data[:1] in (b"\x16", b"\x17") and data[1:2] == b"\x03"
	    clear += b"Bearer" in data or b"HTTP/1" in data or b"api/push" in data
	open("sniff.txt", "w").write("%d %d %d\n" % (seen, tls, clear))
	EOF
    test_expect_success "two nodes: ranks on both nodes push metrics over HTTPS (the default there) to the launch node's address, pinned to the job's certificate; nothing in clear text on the wire" '
        port=$(/usr/bin/python3 -c "import socket; s=socket.socket(); s.bind((\"127.0.0.1\", 0)); print(s.getsockname()[1])") &&
        br=$(sed -n "s/^link \(bmtsl[0-9]*\)\$/\1/p" "$SLURM_DIR/net" | head -1) && test -n "$br" &&
        brip=$(ip -o -4 addr show dev $br | awk "{print \$4}" | cut -d/ -f1) &&
        { /usr/bin/python3 $TMP/sniff.py $br $port & }
        sniffer=$!
        for i in $(seq 100); do test -e sniffing && break; sleep 0.05; done
        { with_timeout 120 salloc -N2 --ntasks-per-node=2 $BMLAUNCH --backend none --metrics-port $port \
            --metrics-linger 10 --log-dir logs -g 2 -n 2 -- $PROGS/steps --steps 5 --pace 200 >out 2>err & }
        job=$!
        until_ended 600 "https://127.0.0.1:$port/api/status?ranks=1" --cacert logs/metrics-ca.pem
        # still serving (the linger): by the bridge address too, never in plain HTTP
        brrc=0; curl -sf --cacert logs/metrics-ca.pem "https://$brip:$port/metrics" >metrics.txt || brrc=$?
        plainrc=0; curl -s --max-time 5 "http://127.0.0.1:$port/metrics" >plain.txt || plainrc=$?
        touch stop; wait $sniffer
        rc=0; wait $job || rc=$?   # salloc keeps SIGINT from bmlaunch: let the linger end
        test $rc -eq 0 && grep -q "bmlaunch: metrics on https://.*:$port/" err &&
        test $brrc -eq 0 && grep -q "^bmt_tokens_total{job_id=\"slurm\.[0-9]*\"} 20030$" metrics.txt &&
        test $plainrc -ne 0 && ! grep -q bmt_ plain.txt &&
        read seen tls clear <sniff.txt && echo "sniffed: $seen segments to port $port, $tls TLS records, $clear in clear" &&
        test $tls -ge 4 && test $clear -eq 0 &&
        /usr/bin/python3 -c "
import json
s = json.load(open(\"s.json\"))
assert s[\"state\"] == \"ended\" and s[\"exit_status\"] == 0, s[\"state\"]
assert s[\"layout\"][\"nodes\"] == 2 and s[\"step\"] == 5, s[\"layout\"]
assert s[\"tokens_total\"] == 5 * (1000 + 1001 + 1002 + 1003), s[\"tokens_total\"]
assert sorted({r[\"host\"] for r in s[\"ranks\"]}) == [\"node1\", \"node2\"], s[\"ranks\"]
"
    '
    test_expect_success "two nodes: a rank on node2 that fails before it pushed is named on node2 on /metrics (srun said where), not on the launch node" '
        port=$(free_port) &&
        { with_timeout 60 salloc -N2 --ntasks-per-node=2 $BMLAUNCH --backend none --metrics-port $port \
            --metrics-linger 8 --log-dir logs -g 2 -n 2 -- $PROGS/behave --rank 3 exit 3 >out 2>err & }
        job=$!
        until_ended 300 "https://127.0.0.1:$port/api/status" --cacert logs/metrics-ca.pem
        rc=0; wait $job || rc=$?
        test $rc -eq 3 && grep -q "^bmlaunch: job failed: rank 3 (on node2) exited with code 3\$" err &&
        /usr/bin/python3 -c "
import json
s = json.load(open(\"s.json\"))
assert s[\"failed_ranks\"] == [{\"rank\": 3, \"host\": \"node2\", \"exit_code\": 3}], s[\"failed_ranks\"]
ev = [e[\"detail\"] for e in s[\"events\"] if e[\"kind\"] == \"rank_failed\"]
assert ev == [\"rank 3 (on node2) exited with code 3\"], ev
" || { cat err s.json; false; }
    '
    test_expect_success "two nodes: SIGINT reaches every task on both nodes as SIGINT; no step or rank left on either" '
        mkdir pids && export BEHAVE_PIDDIR=$PWD/pids &&
        with_timeout 90 salloc -N2 --ntasks-per-node=2 bash -c "sigjob INT 20 4 -g 2 -n 2 -- $PROGS/behave catch 0.5" &&
        test $(grep -c "^[0-3]: rank [0-3]: got SIGINT$" out) -eq 4 &&
        test $(grep -c "^[0-3]: rank [0-3]: handled$" out) -eq 4 &&
        test "$(cat rc)" = 0 && test ! -s steps && test ! -s survivors
    '
    test_expect_success "two nodes: SIGTERM, a task on each node slower than --grace: SIGKILL after it; exit 143; nothing left" '
        mkdir pids && export BEHAVE_PIDDIR=$PWD/pids &&
        with_timeout 90 salloc -N2 --ntasks-per-node=2 bash -c "sigjob TERM 3 4 -g 2 -n 2 -- $PROGS/behave catch 1000" &&
        test $(grep -c "^[0-3]: rank [0-3]: got SIGTERM$" out) -eq 4 &&
        awk "{ exit !(\$1 >= 3 && \$1 < 15) }" secs &&
        test "$(cat rc)" = 143 && test ! -s steps && test ! -s survivors
    '
    test_expect_success "two nodes: a second SIGINT kills every task on both nodes at once" '
        mkdir pids && export BEHAVE_PIDDIR=$PWD/pids &&
        with_timeout 90 salloc -N2 --ntasks-per-node=2 bash -c "sigjob \"INT INT\" 60 4 -g 2 -n 2 -- $PROGS/behave catch 1000" &&
        test $(grep -c ": got SIGINT$" out) -eq 4 && awk "{ exit !(\$1 < 20) }" secs &&
        test "$(cat rc)" = 130 && test ! -s steps && test ! -s survivors
    '
    # ---- PyTorch jobs across nodes (issue 22): torchrun's variables from the
    # wrapper in each task, MASTER_ADDR node1's NodeAddr, gloo across the bridge.
    # The nodes' names do not resolve here, so gloo is told its interface
    # (GLOO_SOCKET_IFNAME, as on clusters whose host names map to another net).
    test_expect_success "two nodes, PyTorch: every task has torchrun's variables of its node; MASTER_ADDR is node1's address" '
        with_timeout 120 salloc -N2 --ntasks-per-node=2 $BMLAUNCH -g 2 -n 2 -- sh -c "env | sort" >out 2>err &&
        addr=$(scontrol show node -o node1 | sed -n "s/.* NodeAddr=\([^ ]*\).*/\1/p") && test -n "$addr" &&
        for r in 0 1 2 3; do
            for v in RANK=$r LOCAL_RANK=$((r % 2)) GROUP_RANK=$((r / 2)) NODE_RANK=$((r / 2)) \
                WORLD_SIZE=4 LOCAL_WORLD_SIZE=2 GROUP_WORLD_SIZE=2 MASTER_ADDR=$addr \
                TORCHELASTIC_RESTART_COUNT=0 TORCHELASTIC_RUN_ID=$(sed -n "s/^0: BMT_JOB_ID=//p" out); do
                grep -qx "$r: $v" out || { echo "rank $r lacks $v"; grep "^$r: " out; exit 1; }
            done
        done &&
        test $(grep -o "MASTER_PORT=[0-9]*\$" out | sort -u | wc -l) -eq 1 &&
        ! grep -q "rendezvous will fail" err
    '
    test_expect_success "two nodes, PyTorch: an unmodified gloo env:// job spans both nodes; world, group and replica all-reduce" '
        addr=$(scontrol show node -o node1 | sed -n "s/.* NodeAddr=\([^ ]*\).*/\1/p") && test -n "$addr" &&
        GLOO_SOCKET_IFNAME=eth0 with_timeout 240 salloc -N2 --ntasks-per-node=2 $BMLAUNCH -g 2 -n 2 -- \
            /usr/bin/python3 $SRC/tests/progs/torch_env.py >out 2>err &&
        for r in 0 1 2 3; do
            grep -q "^$r: torch_env: rank $r of 4: env ok; sums world 10 group $((r < 2 ? 3 : 7)) replica $((r % 2 ? 6 : 4)); hosts node1,node2; restart 0; master $addr:[0-9]*; gloo on cpu\$" out ||
                { echo "rank $r:"; grep "^$r: " out; false; }
        done
    '
    test_expect_success "two nodes, PyTorch: an exception on rank 3 (node2) ends the job: exit 1, rank 3 named with its traceback's last line" '
        { GLOO_SOCKET_IFNAME=eth0 with_timeout 240 salloc -N2 --ntasks-per-node=2 $BMLAUNCH -g 2 -n 2 -- \
            /usr/bin/python3 $SRC/tests/progs/torch_env.py --fail 3 >out 2>err; rc=$?; } &&
        { test $rc -eq 1 &&
            grep -q "^bmlaunch: job failed: rank 3 (on node2) exited with code 1\$" err &&
            sed -n "/^bmlaunch: last [0-9]* lines of rank 3:\$/,\$p" err |
                grep -qx "    3: RuntimeError: torch_env: rank 3 fails on purpose" ||
            { echo "exit $rc"; tail -25 err; false; }; }
    '
    test_expect_success "two nodes, PyTorch: --max-restarts 1 under srun: TORCHELASTIC_RESTART_COUNT 0 then 1, a new MASTER_PORT for the new run" '
        with_timeout 120 salloc -N2 --ntasks-per-node=2 $BMLAUNCH --max-restarts 1 -g 2 -n 2 -- sh -c \
            "echo run \$TORCHELASTIC_RESTART_COUNT of \$TORCHELASTIC_MAX_RESTARTS port \$MASTER_PORT; [ \$TORCHELASTIC_RESTART_COUNT = 1 ] || [ \$RANK != 3 ] || exit 5" >out 2>err &&
        grep -q "^bmlaunch: restart 1 of 1 after rank 3 (on node2) exited with code 5\$" err &&
        for run in 0 1; do
            test $(grep -c "^[0-3]: run $run of 1 port [0-9]*\$" out) -eq 4 &&
            test $(grep "^[0-3]: run $run of 1 port" out | sed "s/.* port //" | sort -u | wc -l) -eq 1 ||
                { echo "run $run:"; grep "run $run" out; exit 1; }
        done &&
        test "$(grep "run 0 of" out | sed "s/.* port //" | sort -u)" != "$(grep "run 1 of" out | sed "s/.* port //" | sort -u)"
    '
    # ---- end of the PyTorch block
    test_expect_success "two nodes: the shm backend refuses ranks on several nodes, clearly" '
        { with_timeout 120 salloc -N2 --ntasks-per-node=2 $BMLAUNCH -g 2 -n 2 -- $PROGS/hello >out 2>err; rc=$?; } &&
        test $rc -eq 1 && grep -q "the shm backend needs every rank on one node" err
    '
    slurm_stop
    stopped_two=$?
fi

# Nodes of 2 CPUs: a CPU job with more ranks than that must still be a script
# that real sbatch takes (--ntasks-per-node=4 is refused there: "Requested node
# configuration is not available").
stopped_small=0
slurm_start one 2
rc=$?
if [ $rc -eq 0 ]; then
    test_expect_success "--sbatch --device cpu, 4 ranks on a node of 2 CPUs: real sbatch takes it and the job runs" '
        $BMLAUNCH --sbatch -g 2 -n 2 --gpus-per-node 4 --time 00:05:00 --output "$PWD/cpu-%j.out" -- $PROGS/hello >cpu.sbatch &&
        grep -qx "#SBATCH --ntasks=4" cpu.sbatch && grep -qx "#SBATCH --overcommit" cpu.sbatch &&
        with_timeout 90 sbatch --wait cpu.sbatch >submitted &&
        id=$(awk "/Submitted batch job/ {print \$4}" submitted) && test -n "$id" &&
        test $(grep -c "sums of ranks: world 6" cpu-$id.out) -eq 4
    '
    slurm_stop
    stopped_small=$?
elif [ $rc -ne 77 ]; then
    test_expect_success "the one-node cluster of 2 CPUs starts" 'false'
fi

test_expect_success "nothing of any cluster is left running (slurm_stop checks every pid)" "
    test $stopped_one -eq 0 && test $stopped_two -eq 0 && test $stopped_small -eq 0
"
test_done
