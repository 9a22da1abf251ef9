#!/bin/bash
# --max-restarts: a job that a rank's failure ended starts again, every rank,
# with BMT_RESTART=k, until it succeeds or the restarts run out; the exit status
# and summary are the last run's; a job stopped by a signal, or one that
# succeeded, is never restarted; nothing of a run (fds, PMIx namespace, shm,
# processes) leaks into the next; the collector counts the restarts; Slurm mode
# restarts srun (here a stand-in for it).
. "$(dirname "$0")/lib.sh"

PY=/usr/bin/python3

# The lines "R: rank R restart N" of rank R, as "0 1 2".
runs_of() { # rank file
    sed -n "s/^$1: rank $1 restart \([0-9]*\)\$/\1/p" "$2" | tr '\n' ' ' | sed 's/ $//'
}
export -f runs_of

test_expect_success "fails twice, then succeeds: --max-restarts 2 exits 0 after 2 restarts" '
    mkdir pids && export BEHAVE_PIDDIR=$PWD/pids &&
    $BMLAUNCH -n 3 --max-restarts 2 -- $PROGS/behave --rank 1 fail-until 2 >out 2>err &&
    test $(grep -c "^bmlaunch: restart" err) -eq 2 &&
    grep -q "^bmlaunch: restart 1 of 2 after rank 1 (pid [0-9]* on .*) exited with code 1\$" err &&
    grep -q "^bmlaunch: restart 2 of 2 after rank 1 (pid [0-9]* on .*) exited with code 1\$" err &&
    for r in 0 1 2; do test "$(runs_of $r out)" = "0 1 2" || { echo "rank $r saw $(runs_of $r out)"; exit 1; }; done &&
    grep -q "^bmlaunch: all 3 ranks exited 0 after" err &&
    grep -q "^bmlaunch: 2 restarts made (--max-restarts 2)\$" err &&
    ! grep -q "job failed" err && no_survivors pids
'

test_expect_success "the same job with --max-restarts 1: exit 1 after one restart, the last run summarized" '
    mkdir pids && export BEHAVE_PIDDIR=$PWD/pids &&
    { $BMLAUNCH -n 3 --max-restarts 1 -- $PROGS/behave --rank 1 fail-until 2 >out 2>err; rc=$?; } &&
    test $rc -eq 1 &&
    test $(grep -c "^bmlaunch: restart" err) -eq 1 && grep -q "^bmlaunch: restart 1 of 1 after rank 1" err &&
    for r in 0 1 2; do test "$(runs_of $r out)" = "0 1" || exit 1; done &&
    grep -q "^bmlaunch: job failed: rank 1 (pid [0-9]* on .*) exited with code 1\$" err &&
    grep -q "^    1: rank 1: failing at restart 1 (until 2)\$" err &&
    ! grep -q "^    1: rank 1: failing at restart 0" err &&
    grep -q "of the 2 other ranks still running: 2 ended on SIGTERM" err &&
    grep -q "^bmlaunch: 1 restart made (--max-restarts 1); none left\$" err &&
    no_survivors pids
'

test_expect_success "a job that fails every time exhausts the restarts; exit is the last failure code" '
    { $BMLAUNCH -n 2 --max-restarts 3 -- sh -c "exit \$((3 + BMT_RESTART))" >out 2>err; rc=$?; } &&
    test $rc -eq 6 &&
    grep -q "^bmlaunch: restart 1 of 3 after rank [01] (pid [0-9]* on .*) exited with code 3\$" err &&
    grep -q "^bmlaunch: restart 2 of 3 after rank [01] .* exited with code 4\$" err &&
    grep -q "^bmlaunch: restart 3 of 3 after rank [01] .* exited with code 5\$" err &&
    test $(grep -c "^bmlaunch: restart" err) -eq 3 &&
    grep -q "^bmlaunch: job failed: rank [01] (pid [0-9]* on .*) exited with code 6\$" err &&
    grep -q "^bmlaunch: 3 restarts made (--max-restarts 3); none left\$" err
'

test_expect_success "SIGTERM to bmlaunch during a restarted run: exit 143, no further restart, no rank left" '
    mkdir pids; export BEHAVE_PIDDIR=$PWD/pids
    $BMLAUNCH -n 3 --max-restarts 5 -- sh -c "[ \$BMT_RESTART = 0 ] && exit 1; exec $PROGS/behave --rank 99 sleep 1" >out 2>err & pid=$!
    for i in $(seq 100); do [ $(ls pids | wc -l) -eq 3 ] && break; sleep 0.05; done &&
    test $(ls pids | wc -l) -eq 3 &&
    kill -TERM $pid && { wait $pid; rc=$?; } &&
    test $rc -eq 143 &&
    grep -q "^bmlaunch: restart 1 of 5 after rank" err && test $(grep -c "^bmlaunch: restart" err) -eq 1 &&
    grep -q "bmlaunch: received SIGTERM; forwarding it to 3 ranks" err &&
    grep -q "the job was ended by SIGTERM sent to bmlaunch" err &&
    grep -q "^bmlaunch: 1 restart made (--max-restarts 5); a job stopped by a signal to bmlaunch is not restarted\$" err &&
    no_survivors pids
'

test_expect_success "a rank killed by a signal forwarded to bmlaunch (SIGUSR1) is not restarted" '
    mkdir pids; export BEHAVE_PIDDIR=$PWD/pids
    $BMLAUNCH -n 2 --max-restarts 3 -- $PROGS/behave --rank 99 sleep 1 >out 2>err & pid=$!
    for i in $(seq 100); do [ $(ls pids | wc -l) -eq 2 ] && break; sleep 0.05; done &&
    kill -USR1 $pid && { wait $pid; rc=$?; } &&
    test $rc -eq 138 && ! grep -q "^bmlaunch: restart" err &&
    grep -q "^bmlaunch: 0 restarts made (--max-restarts 3); a job stopped by a signal" err &&
    no_survivors pids
'

test_expect_success "a job that succeeds runs once, and its ranks see BMT_RESTART=0" '
    $BMLAUNCH -n 2 --max-restarts 3 -- $PROGS/behave env >out 2>err &&
    grep -qx "0: BMT_RESTART=0" out && grep -qx "1: BMT_RESTART=0" out &&
    test $(grep -c "BMT_RESTART=" out) -eq 2 &&
    ! grep -q "restart" err &&
    BMT_RESTART=7 $BMLAUNCH -n 1 -- $PROGS/behave env >out0 && grep -qx "0: BMT_RESTART=0" out0
'

test_expect_success "5 restarts: bmt_init works in every fresh PMIx namespace, open fds do not grow" '
    $BMLAUNCH -v -g 2 -n 2 --max-restarts 5 -- sh -c "$PROGS/behave init && [ \$BMT_RESTART -ge 5 ] || exit 1" >out 2>err &&
    sed -n "s/^bmlaunch: restart \([0-9]\): PMIx namespace \(.*\), \([0-9]*\) open files\$/\1 \2 \3/p" err >runs &&
    test $(wc -l <runs) -eq 5 &&
    test $(cut -d" " -f2 runs | sort -u | wc -l) -eq 5 &&
    grep -q "^5 .*\.restart5 " runs &&
    test $(cut -d" " -f3 runs | sort -u | wc -l) -eq 1 &&
    grep -q "^3: init rank 3 group 1 group_rank 1 world 4\$" out
'

test_expect_success "PMIx_Abort ends a run and restarts the job; the next run bootstraps through PMIx" '
    { $BMLAUNCH -n 3 --max-restarts 1 -- sh -c "if [ \$BMT_RESTART = 0 ]; then exec $PROGS/behave --rank 1 abort 42 \"loss is NaN\"; fi; exec $PROGS/behave init" >out 2>err; rc=$?; } &&
    test $rc -eq 0 &&
    grep -q "^bmlaunch: restart 1 of 1 after rank 1 (pid [0-9]* on .*) called PMIx_Abort with status 42: loss is NaN\$" err &&
    test $(grep -c "init rank" out) -eq 3
'

test_expect_success "a run ended inside shm collectives restarts into working shm collectives" '
    $BMLAUNCH -n 3 --timeout 0.5 --max-restarts 1 -- sh -c "if [ \$BMT_RESTART = 0 ]; then exec $PROGS/behave --rank 1 stall; fi; exec $PROGS/collcheck --quick" >out 2>err &&
    grep -q "^bmlaunch: restart 1 of 1 after rank [02] .* exited with code 1\$" err &&
    test $(grep -c "checks passed on world(3)" out) -eq 3
'

test_expect_success "--log-dir keeps every run in rank-N.log, each restart marked" '
    mkdir pids && export BEHAVE_PIDDIR=$PWD/pids &&
    $BMLAUNCH -n 2 --max-restarts 1 --log-dir logs -- $PROGS/behave --rank 0 fail-until 1 >out 2>err &&
    grep -n "" logs/rank-0.log >lines &&
    a=$(grep -m1 ":rank 0 restart 0\$" lines | cut -d: -f1) &&
    b=$(grep -m1 ":bmlaunch: restart 1 of 1\$" lines | cut -d: -f1) &&
    c=$(grep -m1 ":rank 0 restart 1\$" lines | cut -d: -f1) &&
    test -n "$a" && test -n "$b" && test -n "$c" && test $a -lt $b && test $b -lt $c &&
    grep -qx "rank 1 restart 0" logs/rank-1.log && grep -qx "rank 1 restart 1" logs/rank-1.log
'

test_expect_success "the collector counts restarts and counts the restarted ranks alive again" '
    mkdir pids; export BEHAVE_PIDDIR=$PWD/pids
    port=$($PY -c "import socket; s=socket.socket(); s.bind((\"127.0.0.1\", 0)); print(s.getsockname()[1])")
    $BMLAUNCH --metrics-port $port -n 3 --max-restarts 2 -- sh -c "[ \$BMT_RESTART -lt 2 ] && exit 1; exec $PROGS/behave --rank 99 sleep 1" >out 2>err & pid=$!
    for i in $(seq 100); do [ $(ls pids | wc -l) -eq 3 ] && break; sleep 0.05; done &&
    curl -sf http://127.0.0.1:$port/metrics >m.txt &&
    curl -sf http://127.0.0.1:$port/api/status >s.json &&
    kill -TERM $pid && { wait $pid; rc=$?; } && test $rc -eq 143 &&
    grep -q "^bmt_events_total{job_id=\"[^\"]*\",kind=\"restart\"} 2\$" m.txt &&
    grep -q "^bmt_ranks_alive{job_id=\"[^\"]*\"} 3\$" m.txt &&
    $PY - <<-EOF
	import json
	s = json.load(open("s.json"))
	assert s["ranks_alive"] == 3, s["ranks_alive"]
	ev = [e for e in s["events"] if e["kind"] == "restart"]
	assert len(ev) == 2, s["events"]
	assert all(e["rank"] == -1 for e in ev), ev
	assert ev[0]["detail"].startswith("bmlaunch: restart 1 after rank "), ev
	assert ev[1]["detail"].startswith("bmlaunch: restart 2 after rank "), ev
	assert "exited with code 1" in ev[1]["detail"], ev
	EOF
'

test_expect_success "bad --max-restarts values exit 2 and start nothing" '
    mkdir pids; export BEHAVE_PIDDIR=$PWD/pids
    for v in -1 1001 x "" 1.5 " 3" +3 99999999999; do
        { $BMLAUNCH --max-restarts "$v" -- $PROGS/behave env >out 2>err; rc=$?; } &&
        test $rc -eq 2 && grep -qF -- "--max-restarts needs a count from 0 to 1000, got '"'"'$v'"'"'" err &&
        grep -q "Try '"'"'bmlaunch --help'"'"'" err && test ! -s out || { echo "value [$v]"; cat err; exit 1; }
    done &&
    { $BMLAUNCH --max-restarts >out 2>err; rc=$?; } && test $rc -eq 2 && grep -q -- "--max-restarts needs a value" err &&
    test -z "$(ls pids)"
'

test_expect_success "--sbatch carries --max-restarts into the batch script" '
    $BMLAUNCH --sbatch -n 2 --gpus-per-node 2 --max-restarts 3 -- prog >script &&
    grep -q -- "--grace 5 --max-restarts 3" script
'

# srun for one node, as far as bmlaunch uses it: --ntasks copies of the command
# with SLURM_PROCID, output labelled (--label), signals forwarded, the first
# failing task reported as srun does ("task 2: ...", or "tasks 0-2: ..." for
# several that ended alike) and the others ended (--kill-on-bad-exit).
# Every call appends its tasks' BMT_RESTART to $FAKE_SRUN_LOG.
make_fake_srun() {
    cat >srun <<-'EOF'
	#!/usr/bin/python3
	import os, signal, socket, subprocess, sys, threading, time
	args, n = sys.argv[1:], 1
	while args and args[0].startswith("--"):
	    if args[0].startswith("--ntasks="):
	        n = int(args[0].split("=", 1)[1])
	    args.pop(0)
	with open(os.environ["FAKE_SRUN_LOG"], "a") as f:
	    f.write("srun BMT_RESTART=%s\n" % os.environ.get("BMT_RESTART"))
	procs = []
	for i in range(n):
	    env = dict(os.environ, SLURM_PROCID=str(i), SLURM_LOCALID=str(i), SLURM_NODEID="0")
	    procs.append(subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
	def relay(i, src, dst):
	    for line in iter(src.readline, b""):
	        dst.write(b"%d: " % i + line)
	        dst.flush()
	threads = [threading.Thread(target=relay, args=(i, s, d))
	           for i, p in enumerate(procs)
	           for s, d in ((p.stdout, sys.stdout.buffer), (p.stderr, sys.stderr.buffer))]
	for t in threads:
	    t.start()
	def forward(sig, frame):
	    for p in procs:
	        if p.poll() is None:
	            p.send_signal(sig)
	for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
	    signal.signal(sig, forward)
	def describe(st):
	    return "Exited with exit code %d" % st if st > 0 else signal.strsignal(-st)
	def ranges(tasks):  # [0, 1, 2, 5] -> "0-2,5", as srun writes a task list
	    out, i = [], 0
	    while i < len(tasks):
	        j = i
	        while j + 1 < len(tasks) and tasks[j + 1] == tasks[j] + 1:
	            j += 1
	        out.append(str(tasks[i]) if i == j else "%d-%d" % (tasks[i], tasks[j]))
	        i = j + 1
	    return ",".join(out)
	rc = 0
	while True:
	    done = all(p.poll() is not None for p in procs)
	    bad = [i for i, p in enumerate(procs) if p.poll() not in (None, 0)]
	    if bad and rc == 0:
	        time.sleep(0.1)  # tasks that end alike meanwhile share one report
	        st = procs[bad[0]].poll()
	        same = [i for i, p in enumerate(procs) if p.poll() == st]
	        sys.stderr.write("srun: error: %s: task%s %s: %s\n" % (socket.gethostname(),
	                         "s" if len(same) > 1 else "", ranges(same), describe(st)))
	        sys.stderr.flush()
	        rc = st if st > 0 else 128 - st
	        for q in procs:
	            if q.poll() is None:
	                q.kill()
	    if done:
	        break
	    time.sleep(0.01)
	for t in threads:
	    t.join()
	sys.exit(rc)
	EOF
    chmod +x srun
}
export -f make_fake_srun

test_expect_success "Slurm mode (a stand-in srun): one srun per run, BMT_RESTART reaches the tasks, the last run decides" '
    mkdir pids && export BEHAVE_PIDDIR=$PWD/pids &&
    make_fake_srun && export FAKE_SRUN_LOG=$PWD/sruns &&
    export SLURM_JOB_ID=4242 SLURM_JOB_NUM_NODES=1 SLURM_TASKS_PER_NODE=3 SLURM_JOB_CPUS_PER_NODE=3 &&
    PATH=$PWD:$PATH $BMLAUNCH --metrics-port 0 -n 3 --max-restarts 2 -- $PROGS/behave --rank 2 fail-until 2 >out 2>err &&
    test "$(cat sruns)" = "$(printf "srun BMT_RESTART=%s\n" 0 1 2)" &&
    for r in 0 1 2; do test "$(runs_of $r out)" = "0 1 2" || exit 1; done &&
    grep -q "^bmlaunch: restart 1 of 2 after rank 2 (on [^)]*) exited with code 1\$" err &&
    grep -q "^bmlaunch: restart 2 of 2 after rank 2 (on [^)]*) exited with code 1\$" err &&
    grep -q "^bmlaunch: 2 restarts made (--max-restarts 2)\$" err &&
    rm sruns &&
    { PATH=$PWD:$PATH $BMLAUNCH --metrics-port 0 -n 3 --max-restarts 1 -- $PROGS/behave --rank 2 fail-until 2 >out 2>err; rc=$?; } &&
    test $rc -eq 1 && test $(wc -l <sruns) -eq 2 &&
    grep -q "^bmlaunch: job failed: rank 2 (on [^)]*) exited with code 1\$" err &&
    grep -q "^bmlaunch: 1 restart made (--max-restarts 1); none left\$" err &&
    rm sruns &&
    { PATH=$PWD:$PATH $BMLAUNCH --metrics-port 0 -n 3 --max-restarts 1 -- sh -c "exit \$((3 + BMT_RESTART))" >out 2>err; rc=$?; } &&
    test $rc -eq 4 && test $(wc -l <sruns) -eq 2 &&
    grep -q "^srun: error: .*: tasks 0-2: Exited with exit code 3\$" err &&
    grep -q "^bmlaunch: restart 1 of 1 after rank 0 (on [^)]*) exited with code 3\$" err &&
    grep -q "^bmlaunch: job failed: rank 0 (on [^)]*) exited with code 4\$" err
'

test_done
