#!/bin/bash
# The private Slurm test cluster of tests/slurm/cluster.sh: one node and two nodes (network
# namespaces) start, run PMIx steps (bootcheck), batch jobs, cancellation and failing steps,
# and stop without leaving a daemon, namespace, veth, bridge or directory behind, also when
# the test shell is killed. Needs root, slurm-wlm, munge, libpmix-dev; built test programs.
. "$(dirname "$0")/../integration/lib.sh"
. "$(dirname "$0")/cluster.sh"

test_skip() { # description reason
    test_count=$((test_count + 1))
    echo "ok $test_count - $1 # SKIP $2"
}

# Pids of the `sleep` tasks of job $1 (or, with -t, of every job whose sleep has argument $2)
# of the running cluster.
job_sleeps() { # jobid | -t seconds
    local p want="SLURM_JOB_ID=$1"
    [ "$1" = -t ] && want=
    for p in $(pgrep -x sleep); do
        if [ -n "$want" ]; then
            grep -qzx "$want" "/proc/$p/environ" 2>/dev/null || continue
        else
            [ "$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)" = "$(command -v sleep) $2 " ] || continue
        fi
        grep -qzxF "SLURM_CONF=$SLURM_CONF" "/proc/$p/environ" 2>/dev/null && echo "$p"
    done
}
# Fails if any of the pids is alive (zombies count as dead).
all_gone() { # pid...
    local p
    for p in "$@"; do
        if kill -0 "$p" 2>/dev/null && ! grep -q '^State:.*Z' "/proc/$p/status" 2>/dev/null; then
            echo "pid $p is alive: $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)" >&2
            return 1
        fi
    done
}
# Fails if a process still carries the marker of cluster directory $1.
no_marked() { # dir
    if grep -lzxF "BMT_SLURM_CLUSTER=$1" /proc/[0-9]*/environ 2>/dev/null | grep -q .; then
        echo "processes of $1 are still running" >&2
        return 1
    fi
}
export -f job_sleeps all_gone no_marked

# Saves what slurm_stop must remove: pid files to $TMP/$1.pids/, the cluster's dir and its
# network objects to $TMP/$1.dir and $TMP/$1.net.
snapshot() { # tag
    mkdir -p "$TMP/$1.pids"
    cp "$SLURM_DIR"/pid.* "$TMP/$1.pids/"
    echo "$SLURM_DIR" >"$TMP/$1.dir"
    cp "$SLURM_DIR/net" "$TMP/$1.net"
}
# Stops the cluster in this shell and checks that everything it had is gone.
stop_and_check() { # tag description
    local tag=$1 rc=0 rc2=0 failed=$test_failures
    snapshot "$tag"
    slurm_stop 2>"$TMP/$tag.stop" || rc=$?
    slurm_stop 2>>"$TMP/$tag.stop" || rc2=$?
    test_expect_success "$2" "
        cat '$TMP/$tag.stop'; test $rc -eq 0 && test $rc2 -eq 0 &&
        test -z \"\${SLURM_DIR:-}\" && test -z \"\${SLURM_CONF:-}\" &&
        no_survivors '$TMP/$tag.pids' && no_marked \"\$(cat '$TMP/$tag.dir')\" &&
        ! test -e \"\$(cat '$TMP/$tag.dir')\" &&
        while read -r kind name; do
            case \$kind in
            netns) ! ip netns list | awk '{ print \$1 }' | grep -qx \"\$name\" || { echo \"netns \$name left\"; false; } ;;
            link) ! ip link show \"\$name\" >/dev/null 2>&1 || { echo \"link \$name left\"; false; } ;;
            esac
        done <'$TMP/$tag.net'
    "
    [ "$test_failures" -eq "$failed" ]
}

if [ "$(id -u)" != 0 ]; then
    test_skip "Slurm test clusters" "needs root"
    test_done
    exit
fi

# ---------------------------------------------------------------- one node
t0=$SECONDS
rc=0
slurm_start one 2>"$TMP/one.start" || rc=$?
test_expect_success "one node: slurm_start returns with the node idle ($((SECONDS - t0)) s)" "
    cat '$TMP/one.start'; test $rc -eq 0 &&
    sinfo -h -N -o '%N %T' | grep -qx \"\$SLURM_TEST_NODES idle\" &&
    grep -qx \"AuthInfo=socket=\$SLURM_DIR/munge/munge.sock\" \"\$SLURM_CONF\"
"
if [ "$rc" -eq 0 ]; then
    fails=$test_failures
    test_expect_success "one node: srun -n 4 --mpi=pmix bootcheck: the PMIx fence joins all 4 ranks" '
        with_timeout 60 srun -n 4 --mpi=pmix env BMT_GROUPS=2 BMT_GPUS_PER_GROUP=2 \
            BMT_GPUS_PER_NODE=4 $PROGS/bootcheck >out 2>err || { cat out err; false; }
        cat out
        grep -q "^bootcheck: rank 0: 4 ranks (2 x 2) on 1 host .*every peer.s placement and communicators check out" out
    '
    test_expect_success "one node: sbatch --wait runs a script; its output file holds what it printed" '
        printf "#!/bin/sh\necho \"batch \$SLURM_JOB_ID on \$SLURMD_NODENAME says hello\"\n" >job.sh &&
        jid=$(with_timeout 60 sbatch --parsable --wait -o job.out job.sh) &&
        cat job.out && grep -qx "batch $jid on $SLURM_TEST_NODES says hello" job.out
    '
    test_expect_success "one node: scancel ends a running job; no sleep of it is left" '
        jid=$(sbatch --parsable -o job.out --wrap "srun sleep 60") && pids= &&
        for i in $(seq 150); do pids=$(job_sleeps $jid); [ -n "$pids" ] && break; sleep 0.1; done &&
        { test -n "$pids" || { echo "no sleep of job $jid started"; squeue; false; }; } &&
        scancel $jid &&
        for i in $(seq 150); do
            test -z "$(squeue -h -j $jid -t PD,R,CG,CF,S -o %i)" && all_gone $pids 2>/dev/null && break
            sleep 0.1
        done &&
        scontrol show job $jid | grep -q "JobState=CANCELLED" &&
        test -z "$(squeue -h -j $jid -t PD,R,CG,CF,S -o %i)" && all_gone $pids &&
        test -z "$(job_sleeps $jid)"
    '
    test_expect_success "one node: a step whose task exits 3 makes srun exit non-zero" '
        rc=0
        with_timeout 60 srun -n 2 sh -c "test \$SLURM_PROCID != 1 || exit 3" || rc=$?
        echo "srun exited $rc"; test $rc -ne 0 && test $rc -ne 124
    '
    [ "$test_failures" -eq "$fails" ] || slurm_logs 15 | sed 's/^/# /'
    # leave a batch job and an srun running: slurm_stop must end them, tasks included
    jid=$(sbatch --parsable -o /dev/null --wrap "srun sleep 61")
    srun sleep 62 >/dev/null 2>&1 &
    srun_pid=$!
    for _ in $(seq 150); do
        test -n "$(job_sleeps "$jid")" && test -n "$(job_sleeps -t 62)" && break
        sleep 0.1
    done
    mkdir -p "$TMP/one.pids"
    running=$({ job_sleeps "$jid"; job_sleeps -t 62; echo "$srun_pid"; } | tr '\n' ' ')
    running=${running% }
    for p in $running; do echo "$p" >"$TMP/one.pids/pid.running.$p"; done
    stop_and_check one "one node: slurm_stop (twice) with a job and an srun running leaves no daemon, task ($running), client or directory" ||
        true
    kill -KILL "$srun_pid" 2>/dev/null # only if slurm_stop failed to
    wait "$srun_pid" 2>/dev/null
fi

# A shell that started a cluster and is killed with TERM stops it through its EXIT trap, and
# the EXIT trap it had before slurm_start still runs.
t0=$SECONDS
mkdir -p "$TMP/trap"
bash -c 'trap "kill \$s 2>/dev/null; echo the old EXIT trap ran" EXIT; s=
         . "$1"; slurm_start one || exit 1; cp "$SLURM_DIR"/pid.* "$2/"; echo "$SLURM_DIR" >"$2/dir"
         sleep 60 & s=$!; wait' sh "$SRC/tests/slurm/cluster.sh" "$TMP/trap" >"$TMP/trap.out" 2>&1 &
child=$!
for _ in $(seq 200); do [ -s "$TMP/trap/dir" ] && break; kill -0 $child 2>/dev/null || break; sleep 0.1; done
kill -TERM $child 2>/dev/null
wait $child
rc=$?
test_expect_success "a shell killed by TERM stops its cluster through the EXIT trap, keeping the old one ($((SECONDS - t0)) s)" "
    cat '$TMP/trap.out'; test $rc -eq 143 && test -s '$TMP/trap/dir' && grep -qx 'the old EXIT trap ran' '$TMP/trap.out' &&
    no_survivors '$TMP/trap' && no_marked \"\$(cat '$TMP/trap/dir')\" && ! test -e \"\$(cat '$TMP/trap/dir')\"
"

# ---------------------------------------------------------------- two nodes
t0=$SECONDS
rc=0
slurm_start two 2>"$TMP/two.start" || rc=$?
if [ "$rc" -eq 77 ]; then
    test_skip "two nodes in network namespaces" "$(tr '\n' ' ' <"$TMP/two.start")"
else
    test_expect_success "two nodes: slurm_start returns with both nodes idle ($((SECONDS - t0)) s)" "
        cat '$TMP/two.start'; test $rc -eq 0 &&
        test \"\$(sinfo -h -N -o '%N %T' | sort -u | tr '\n' ' ')\" = 'node1 idle node2 idle '
    "
fi
if [ "$rc" -eq 0 ]; then
    fails=$test_failures
    test_expect_success "two nodes: srun -N 2 --ntasks-per-node 2 puts ranks 0,1 on node1 and 2,3 on node2" '
        with_timeout 60 srun -N 2 -n 4 --ntasks-per-node 2 --mpi=pmix \
            sh -c "echo \$SLURM_PROCID \$SLURMD_NODENAME \$(hostname)" | sort >where &&
        cat where &&
        test "$(tr "\n" " " <where)" = "0 node1 node1 1 node1 node1 2 node2 node2 3 node2 node2 "
    '
    test_expect_success "two nodes: bootcheck over 4 ranks on 2 nodes: the PMIx fence crosses nodes" '
        with_timeout 60 srun -N 2 -n 4 --ntasks-per-node 2 --mpi=pmix env BMT_GROUPS=2 \
            BMT_GPUS_PER_GROUP=2 BMT_GPUS_PER_NODE=2 $PROGS/bootcheck >out 2>err || { cat out err; false; }
        cat out
        grep -q "^bootcheck: rank 0: 4 ranks (2 x 2) on 2 hosts node1,node2; every peer.s placement and communicators check out" out
    '
    # Plain srun, no BMT_ layout: each rank takes its ranks per node from its
    # own node's PMIx local size. 2 + 1 tasks: node1 says 2 (which does not
    # divide 3: one node of 3), node2 says 1. Before, every rank went on with
    # its own layout (backend none: nothing noticed).
    test_expect_success "two nodes, plain srun, 2 + 1 tasks: the ranks disagree on the layout and bmt_init fails on each" '
        { with_timeout 60 srun -N 2 -n 3 --mpi=pmix $PROGS/behave init >out 2>err; rc=$?; } &&
        cat out err && test $rc -ne 0 && ! grep -q "^init rank" out &&
        test $(grep -c "the ranks disagree on the layout: rank 2.s is 1 x 3 with 1 ranks per node, rank 0.s 1 x 3 with 3" err) -eq 3
    '
    # Cyclic placement: node1 holds ranks 0 and 2, node2 ranks 1 and 3, so the
    # layout (2 per node, block) would give rank 2 cuda:0, the GPU of rank 0.
    test_expect_success "two nodes, plain srun --distribution=cyclic, cuda: local ranks unlike the layout are refused" '
        { with_timeout 60 srun -N 2 -n 4 --ntasks-per-node 2 --distribution=cyclic --mpi=pmix \
            env BMT_DEVICE=cuda $PROGS/behave init >out 2>err; rc=$?; } &&
        cat out err && test $rc -ne 0 &&
        grep -q "rank 2: PMIx places it as local rank 1 of 2 on node1, but the layout (2 ranks per node) makes it local rank 0 and would give it cuda:0" err &&
        grep -q "rank 1: PMIx places it as local rank 0 of 2 on node2, but the layout (2 ranks per node) makes it local rank 1" err
    '
    [ "$test_failures" -eq "$fails" ] || slurm_logs 15 | sed 's/^/# /'
    stop_and_check two "two nodes: slurm_stop (twice) leaves no daemon, namespace, veth, bridge or directory" ||
        true
fi

test_done
