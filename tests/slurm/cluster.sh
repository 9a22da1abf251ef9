# tests/slurm/cluster.sh — a private, throw-away Slurm cluster for tests (bash; source it).
#
#   . "$(dirname "$0")/cluster.sh"
#   slurm_start one || exit 1      # or: slurm_start two 64; status 77 = cannot here, skip
#   srun -n 4 --mpi=pmix prog ...  # the calling shell now talks to this cluster only
#   slurm_stop                     # also run from the EXIT trap slurm_start installs
#
# slurm_start one|two [CPUS_PER_NODE]
#     Starts a cluster under a fresh directory $SLURM_DIR (mktemp under ${TMPDIR:-/tmp}) and
#     returns 0 once `sinfo` shows every node idle (deadline $SLURM_TEST_TIMEOUT, default 20 s).
#       one: one node named after the short host name (NodeAddr=127.0.0.1); slurmctld and
#            slurmd on loopback.
#       two: nodes node1 and node2, each slurmd in a network namespace and a UTS namespace
#            of its own (`hostname` says node1/node2) on a private bridge: a free /24
#            10.200.K.0/24 (no address or route of the machine in it; the bridge's name
#            bmtslK claims it atomically against concurrent clusters), slurmctld on
#            10.200.K.1 in the root namespace, nodes on .11 and .12 (namespaces
#            bmtslK-node1/2, veths bmtslKv1/2). No route leaves the namespaces.
#            Note: with many CPUs per node, `srun -N 2 -n 4` places 3+1 tasks; pass
#            --ntasks-per-node for a fixed placement.
#     CPUS_PER_NODE (default 64, any number up to 65533) is what each node declares
#     (SlurmdParameters=config_overrides: more than the machine has is fine). MaxTasksPerNode
#     is max(4096, CPUS_PER_NODE); the partition (Default=YES) has OverSubscribe=FORCE:64.
#     Every daemon is private: its own munged (own key and socket, AuthInfo=socket=...),
#     random free SlurmctldPort/SlurmdPort, state, spool, TmpFS, pid and log files under
#     $SLURM_DIR, a random FirstJobId (so PMIx namespaces "slurm.pmix.JOB.STEP" of two
#     concurrent clusters differ). In the calling shell it
#       exports SLURM_CONF, SLURM_DIR, SLURM_TEST_MODE (one|two), SLURM_TEST_NODES (node
#         names, space separated), SLURM_TEST_CPUS (CPUS_PER_NODE);
#       unsets inherited SLURM_*/SBATCH_*/SALLOC_*/SRUN_*/SQUEUE_*/SINFO_* variables (an outer
#         allocation's SLURM_JOB_ID would confuse srun), except SLURM_CONF, SLURM_DIR,
#         SLURM_KEEP and SLURM_TEST_*;
#       adds slurm_stop to the shell's EXIT trap (keeping what was there) and makes TERM/INT
#         exit through it; a trap you set later must call slurm_stop itself.
#     Call it in the test script's main shell, not inside a test body: a body is a subshell,
#     so its exports vanish and its EXIT trap stops the cluster when the body ends.
#     Returns 0: running; 1: failed (the reason and the daemon logs on stderr, everything
#     already stopped again); 77: this machine cannot do it (not root, or for `two` no rights
#     to create network namespaces/bridges); 2: usage (or a cluster of this shell runs already).
#
# slurm_stop
#     Stops everything this cluster started, also while jobs run: the daemons (pids in
#     $SLURM_DIR/pid.*; the marker $BMT_SLURM_CLUSTER=$SLURM_DIR in their environment), every
#     slurmstepd holding a file under $SLURM_DIR open, every srun/sbatch/salloc/sattach/
#     scancel/scontrol/squeue/sinfo/sstat whose SLURM_CONF is this cluster's (a client left
#     waiting on dead daemons would hang), all their descendants (job tasks) and anything in
#     its namespaces: TERM (slurmstepd and clients: KILL), KILL after 3 s; returns once none
#     is left.
#     Removes its veths, namespaces and bridge, then $SLURM_DIR (if $SLURM_KEEP is non-empty
#     only state/spool/tmp/munge go: logs and slurm.conf stay, their place is printed).
#     Unsets SLURM_CONF and SLURM_DIR. Safe to call twice, with no cluster, and from an EXIT
#     trap; refuses (1) a $SLURM_DIR that slurm_start did not make. Returns 1 if something
#     survived KILL. Before the call, $SLURM_DIR/pid.* (one pid a file: lib.sh's no_survivors
#     reads them) and $SLURM_DIR/net ("netns NAME" or "link NAME" a line) say what goes.
#     Typically 0.2 s; about 1 s when steps or clients are still running.
#
# slurm_logs [LINES]
#     Prints the last LINES (default 40) of every daemon log and daemon stdout/stderr file of
#     the running cluster, each under a "==> file <==" header (for failing tests).
#
# Tunables (environment): SLURM_TEST_TIMEOUT (s to wait for idle nodes, default 20),
# SLURM_KEEP (keep logs), TMPDIR. Requires root, slurm-wlm (slurmctld, slurmd, slurm-client),
# munge, libpmix-dev (--mpi=pmix), procps (ps), and for `two` iproute2 and util-linux
# (nsenter, unshare). Works under the caller's set -u, set -e and pipefail.

_SLURM_MARK=BMT_SLURM_CLUSTER # env marker: $_SLURM_MARK=$SLURM_DIR on every daemon
_SLURM_CLIENTS='srun|sbatch|salloc|sattach|scancel|scontrol|squeue|sinfo|sstat'
_SLURM_KILLNOW="^(slurmstepd|$_SLURM_CLIENTS)\$" # comm names that slurm_stop KILLs at once

_slurm_err() { echo "slurm_start: $*" >&2; }

_slurm_listening() { # port: is it a listening TCP port in this network namespace?
    local hex
    hex=$(printf '%04X' "$1")
    awk -v p=":$hex" 'FNR > 1 && $4 == "0A" && substr($2, length($2) - 4) == p { f = 1 }
        END { exit !f }' /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

_slurm_free_port() { # not in the ephemeral range, not 6817-6819, not listening, not in $1
    local p i lo
    lo=$(awk '{ print $1 }' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
    [ "$lo" -gt 12000 ] 2>/dev/null || lo=32768
    for i in $(seq 1 200); do
        p=$(((RANDOM * 32768 + RANDOM + $$) % (lo - 11000) + 11000))
        case " $1 " in *" $p "*) continue ;; esac
        _slurm_listening "$p" && continue
        echo "$p"
        return 0
    done
    return 1
}

_slurm_conf() { # mode cpus ctld_port slurmd_port host ctld_addr net_prefix
    local mode=$1 cpus=$2 cport=$3 dport=$4 host=$5 caddr=$6 net=$7 d=$SLURM_DIR maxt
    maxt=$((cpus > 4096 ? cpus : 4096))
    cat <<EOF
# generated by tests/slurm/cluster.sh ($mode node(s)); everything private to $d
ClusterName=bmt$(echo "${d##*.}" | tr '[:upper:]' '[:lower:]' | tr -cd '[:lower:][:digit:]')
SlurmctldHost=$host($caddr)
SlurmctldPort=$cport
SlurmdPort=$dport
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$d/munge/munge.sock
MpiDefault=pmix
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SlurmdParameters=config_overrides
PlugStackConfig=$d/plugstack.conf
MailProg=/bin/true
ReturnToService=2
FirstJobId=$(((RANDOM * 32768 + RANDOM) % 50000000 + 1000))
MaxTasksPerNode=$maxt
KillWait=2
MessageTimeout=10
SlurmdTimeout=30
SlurmctldTimeout=30
InactiveLimit=0
MinJobAge=60
WaitTime=0
SlurmctldDebug=info
SlurmdDebug=info
StateSaveLocation=$d/state
SlurmctldPidFile=$d/run/slurmctld.pid
SlurmctldLogFile=$d/log/slurmctld.log
SlurmdPidFile=$d/run/slurmd-%n.pid
SlurmdSpoolDir=$d/spool/%n
SlurmdLogFile=$d/log/slurmd-%n.log
TmpFS=$d/tmp/%n
EOF
    if [ "$mode" = one ]; then
        echo "NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN"
        echo "PartitionName=bmt Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:64"
    else
        echo "NodeName=node1 NodeAddr=$net.11 NodeHostname=node1 CPUs=$cpus State=UNKNOWN"
        echo "NodeName=node2 NodeAddr=$net.12 NodeHostname=node2 CPUs=$cpus State=UNKNOWN"
        echo "PartitionName=bmt Nodes=node1,node2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:64"
    fi
}

_slurm_daemon() { # name command...: start it in the background, marked, pid in $SLURM_DIR/pid.name
    local name=$1
    shift
    env "$_SLURM_MARK=$SLURM_DIR" "$@" </dev/null >>"$SLURM_DIR/log/$name.out" 2>&1 &
    echo $! >"$SLURM_DIR/pid.$name"
    disown $! 2>/dev/null || true # not a job of the caller: a plain `wait` must not wait for it
}

_slurm_net_up() { # sets _slurm_net (a.b.c) and records what it makes in $SLURM_DIR/net
    local start i k out
    _slurm_net=
    start=$(((RANDOM + $$) % 250))
    for i in $(seq 0 249); do
        k=$(((start + i) % 250 + 1))
        # skip a /24 any interface or route of this machine already uses
        ip -o -4 addr show 2>/dev/null | grep -qF "inet 10.200.$k." && continue
        ip -4 route show 2>/dev/null | awk -v n="10.200.$k." 'index($1, n) == 1 { f = 1 } END { exit !f }' && continue
        # the bridge's name claims the /24: a second cluster's `ip link add` fails with EEXIST
        if out=$(ip link add "bmtsl$k" type bridge 2>&1); then
            _slurm_net=10.200.$k
            break
        fi
        case $out in *"File exists"*) continue ;; esac
        _slurm_err "cannot create a network bridge here (${out}); two-node clusters need CAP_NET_ADMIN"
        return 77
    done
    if [ -z "$_slurm_net" ]; then
        _slurm_err "no free 10.200.X.0/24 for a bridge (all 250 in use?)"
        return 1
    fi
    echo "link bmtsl$k" >>"$SLURM_DIR/net"
    if ! out=$(ip netns add "bmtsl$k-node1" 2>&1); then
        _slurm_err "cannot create a network namespace here (${out}); skipping two-node clusters"
        return 77
    fi
    echo "netns bmtsl$k-node1" >>"$SLURM_DIR/net"
    if ! out=$(_slurm_net_links "$k" 2>&1); then
        _slurm_err "setting up the network failed: $out"
        return 1
    fi
}

_slurm_net_links() { # k: the bridge's address, the second namespace, veths, addresses
    local k=$1 i
    ip addr add "$_slurm_net.1/24" dev "bmtsl$k" && ip link set "bmtsl$k" up || return 1
    for i in 1 2; do
        if [ "$i" = 2 ]; then
            ip netns add "bmtsl$k-node$i" || return 1
            echo "netns bmtsl$k-node$i" >>"$SLURM_DIR/net"
        fi
        ip link add "bmtsl${k}v$i" type veth peer name eth0 netns "bmtsl$k-node$i" || return 1
        echo "link bmtsl${k}v$i" >>"$SLURM_DIR/net"
        ip link set "bmtsl${k}v$i" master "bmtsl$k" up &&
            ip -n "bmtsl$k-node$i" link set lo up &&
            ip -n "bmtsl$k-node$i" addr add "$_slurm_net.1$i/24" dev eth0 &&
            ip -n "bmtsl$k-node$i" link set eth0 up || return 1
    done
}

slurm_start() { # one|two [CPUS_PER_NODE]
    local mode=${1:-} cpus=${2:-64} host cport dport caddr net='' rc i tmo deadline states bad
    case $mode in one | two) ;; *)
        echo "usage: slurm_start one|two [CPUS_PER_NODE]" >&2
        return 2
        ;;
    esac
    case $cpus in '' | *[!0-9]*) echo "slurm_start: CPUS_PER_NODE '$cpus' is not a number" >&2 && return 2 ;; esac
    if [ "$cpus" -lt 1 ] || [ "$cpus" -gt 65533 ]; then
        echo "slurm_start: CPUS_PER_NODE $cpus is not in 1..65533" >&2
        return 2
    fi
    if [ -n "${SLURM_DIR:-}" ] && [ -f "$SLURM_DIR/slurm.conf" ] && [ "${_SLURM_OWNER:-}" = "$BASHPID" ]; then
        echo "slurm_start: a cluster runs already in $SLURM_DIR; slurm_stop it first" >&2
        return 2
    fi
    if [ "$(id -u)" != 0 ]; then
        _slurm_err "needs root (slurmd runs jobs as any user); skipping"
        return 77
    fi
    local need="slurmctld slurmd srun sbatch sinfo munged"
    [ "$mode" = two ] && need="$need ip nsenter unshare"
    for i in $need; do
        if ! command -v "$i" >/dev/null 2>&1; then
            _slurm_err "'$i' is not installed (scripts/deps.sh: slurm-wlm munge iproute2 util-linux)"
            return 1
        fi
    done
    # a fresh environment for the clients: nothing of an outer Slurm job or user defaults
    for i in $(compgen -e); do
        case $i in
        SLURM_CONF | SLURM_DIR | SLURM_KEEP | SLURM_TEST_*) ;;
        SLURM_* | SBATCH_* | SALLOC_* | SRUN_* | SQUEUE_* | SINFO_* | SCANCEL_*) unset "$i" ;;
        esac
    done
    SLURM_DIR=$(mktemp -d "${TMPDIR:-/tmp}/bmt-slurm.XXXXXX") || return 1
    chmod 755 "$SLURM_DIR"
    export SLURM_DIR
    _SLURM_OWNER=$BASHPID
    _slurm_trap
    mkdir -p "$SLURM_DIR"/{munge,state,run,log,spool,tmp}
    : >"$SLURM_DIR/plugstack.conf"
    : >"$SLURM_DIR/net"
    : >"$SLURM_DIR/.bmt-slurm-cluster"

    host=$(hostname) && host=${host%%.*} # the short name slurmctld checks; no DNS needed
    if [ "$mode" = two ]; then
        rc=0
        _slurm_net_up || rc=$?
        if [ "$rc" -ne 0 ]; then
            slurm_stop >/dev/null 2>&1
            return "$rc"
        fi
        net=$_slurm_net
        SLURM_TEST_NODES="node1 node2"
    else
        SLURM_TEST_NODES=$host
    fi
    for i in $SLURM_TEST_NODES; do mkdir -p "$SLURM_DIR/spool/$i" "$SLURM_DIR/tmp/$i"; done
    if ! cport=$(_slurm_free_port "") || ! dport=$(_slurm_free_port "$cport"); then
        _slurm_err "no free TCP port"
        slurm_stop >/dev/null 2>&1
        return 1
    fi
    caddr=127.0.0.1
    [ -n "$net" ] && caddr=$net.1
    _slurm_conf "$mode" "$cpus" "$cport" "$dport" "$host" "$caddr" "$net" >"$SLURM_DIR/slurm.conf"
    export SLURM_CONF=$SLURM_DIR/slurm.conf SLURM_TEST_MODE=$mode SLURM_TEST_NODES SLURM_TEST_CPUS=$cpus

    # munge: a key of its own, a socket of its own
    head -c 1024 /dev/urandom >"$SLURM_DIR/munge/munge.key" && chmod 400 "$SLURM_DIR/munge/munge.key"
    _slurm_daemon munged munged -F -f --socket="$SLURM_DIR/munge/munge.sock" \
        --key-file="$SLURM_DIR/munge/munge.key" --pid-file="$SLURM_DIR/run/munged.pid" \
        --log-file="$SLURM_DIR/log/munged.log" --seed-file="$SLURM_DIR/munge/seed"
    tmo=${SLURM_TEST_TIMEOUT:-20}
    deadline=$((SECONDS + tmo))
    while ! [ -S "$SLURM_DIR/munge/munge.sock" ]; do
        if ! kill -0 "$(cat "$SLURM_DIR/pid.munged")" 2>/dev/null || [ $SECONDS -ge $deadline ]; then
            _slurm_err "munged did not start"
            slurm_logs >&2
            slurm_stop >/dev/null 2>&1
            return 1
        fi
        sleep 0.05
    done

    _slurm_daemon slurmctld slurmctld -D -i -f "$SLURM_CONF"
    if [ "$mode" = one ]; then
        _slurm_daemon "slurmd-$host" slurmd -D -f "$SLURM_CONF" -N "$host"
    else
        for i in 1 2; do
            _slurm_daemon "slurmd-node$i" nsenter --net="/run/netns/${net/10.200./bmtsl}-node$i" \
                unshare --uts sh -c 'hostname "$1" && exec slurmd -D -f "$2" -N "$1"' sh "node$i" "$SLURM_CONF"
        done
    fi

    # wait until every node is idle (or a daemon dies, or the deadline passes)
    while :; do
        states=$(timeout 5 sinfo -h -N -o '%N %T' 2>/dev/null | sort -u) || true
        bad=0
        for i in $SLURM_TEST_NODES; do
            printf '%s\n' "$states" | grep -qx "$i idle" || bad=1
        done
        [ "$bad" = 0 ] && return 0
        for i in "$SLURM_DIR"/pid.*; do
            if ! kill -0 "$(cat "$i")" 2>/dev/null; then
                _slurm_err "${i##*/pid.} exited during start-up"
                bad=2
            fi
        done
        if [ "$bad" = 2 ] || [ $SECONDS -ge $deadline ]; then
            [ "$bad" = 2 ] || _slurm_err "nodes not idle after ${tmo} s; sinfo says: ${states//$'\n'/, }"
            slurm_logs >&2
            slurm_stop >/dev/null 2>&1
            return 1
        fi
        sleep 0.2
    done
}

_slurm_trap() { # add slurm_stop to the EXIT trap of this shell once; TERM/INT exit through it
    local old
    old=$(trap -p EXIT)
    case $old in *slurm_stop*) return 0 ;; esac
    if [ "$BASHPID" = "$$" ] && [ -n "$old" ]; then
        eval "set -- $old" # trap -- 'CMD' EXIT
        # shellcheck disable=SC2064 # the old command is meant to be expanded now
        trap "slurm_stop; $3" EXIT
    else # a subshell: the parent's trap is not ours to run
        trap 'slurm_stop' EXIT
    fi
    [ -n "$(trap -p TERM)" ] || trap 'exit 143' TERM
    [ -n "$(trap -p INT)" ] || trap 'exit 130' INT
}

_slurm_starttime() { # pid: field 22 of /proc/PID/stat (tells a pid from a reused one)
    local st
    st=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    st=${st##*) } # the fields after "(comm) "
    # shellcheck disable=SC2086 # split into fields on purpose
    set -- $st
    echo "${20}"
}

_slurm_procs() { # dir netns...: "pid starttime comm" of this cluster's processes, one a line
    # Roots: the daemons (marker in their environment; the pid files), every slurmstepd with
    # a file of $dir open (its log: setproctitle may overwrite its environment), the
    # clients srun/sbatch/... whose SLURM_CONF is this cluster's, anything in its netns.
    # Then every descendant of a root. Zombies are left out: they are dead already.
    local dir=$1 ns p c
    shift
    {
        grep -lzxF -- "$_SLURM_MARK=$dir" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3 || true
        cat "$dir"/pid.* 2>/dev/null || true
        ps -e -o pid=,comm= | while read -r p c; do
            case $c in
            slurmstepd)
                if find "/proc/$p/fd" -mindepth 1 -lname "$dir/*" 2>/dev/null | grep -q .; then echo "$p"; fi ;;
            srun | sbatch | salloc | sattach | scancel | scontrol | squeue | sinfo | sstat) # $_SLURM_CLIENTS
                if grep -qzxF -- "SLURM_CONF=$dir/slurm.conf" "/proc/$p/environ" 2>/dev/null; then
                    echo "$p"
                fi ;;
            esac
        done
        for ns in "$@"; do ip netns pids "$ns" 2>/dev/null || true; done
    } | sort -u | {
        # a pid from a pid file counts only while it carries the marker (pids get reused)
        roots=
        while read -r p; do
            [ -n "$p" ] || continue
            if grep -qzxF -- "$_SLURM_MARK=$dir" "/proc/$p/environ" 2>/dev/null ||
                ! grep -qx "$p" "$dir"/pid.* 2>/dev/null; then
                roots="$roots $p"
            fi
        done
        [ -n "$roots" ] || exit 0
        ps -e -o pid=,ppid=,stat=,comm= | awk -v roots="$roots" -v self="$$" '
            { ppid[$1] = $2; st[$1] = $3; cm[$1] = $4; n[++c] = $1 }
            END {
                split(roots, r, " "); for (i in r) mine[r[i]] = 1
                do { more = 0
                     for (i = 1; i <= c; i++) { p = n[i]
                         if (!(p in mine) && (ppid[p] in mine)) { mine[p] = 1; more = 1 } } } while (more)
                for (p in mine) if ((p in st) && st[p] !~ /^Z/ && p != self) print p, cm[p]
            }' | while read -r p c; do
            if st=$(_slurm_starttime "$p"); then echo "$p $st $c"; fi
        done
    }
    return 0
}

_slurm_alive() { # "pid starttime comm" lines on stdin: those still running (not zombies)
    local p st c now
    while read -r p st c; do
        [ -n "$p" ] || continue
        now=$(_slurm_starttime "$p") || continue
        [ "$now" = "$st" ] || continue
        grep -q '^State:.*Z' "/proc/$p/status" 2>/dev/null && continue
        echo "$p $st $c"
    done
}

slurm_stop() {
    local dir=${SLURM_DIR:-} procs i kind name netns=() links=() left=0 grace
    [ -n "$dir" ] || return 0
    if [ -e "$dir" ] && ! [ -f "$dir/.bmt-slurm-cluster" ]; then
        echo "slurm_stop: $dir is not a cluster of tests/slurm/cluster.sh; left alone" >&2
        return 1
    fi
    if [ -f "$dir/net" ]; then
        while read -r kind name; do
            case $kind in netns) netns+=("$name") ;; link) links+=("$name") ;; esac
        done <"$dir/net"
    fi
    # TERM the daemons and tasks; KILL slurmstepd and the clients at once (with slurmctld
    # and slurmd gone they would only wait for them, srun for up to its KillWait and more).
    # Processes found once stay on the list (an orphaned task loses its slurmstepd parent);
    # new ones found by each scan join it. After 3 s, KILL what is left.
    procs=$(_slurm_procs "$dir" ${netns[@]+"${netns[@]}"}) || true
    grace=$((SECONDS + 3))
    # shellcheck disable=SC2046 # pid lists are split on purpose
    for i in $(seq 1 100); do
        [ -n "$procs" ] || break
        if [ "$SECONDS" -ge "$grace" ]; then
            kill -KILL $(echo "$procs" | awk '{ print $1 }') 2>/dev/null || true
        else
            kill -KILL $(echo "$procs" | awk "\$3 ~ /$_SLURM_KILLNOW/ { print \$1 }") 2>/dev/null || true
            kill -TERM $(echo "$procs" | awk "\$3 !~ /$_SLURM_KILLNOW/ { print \$1 }") 2>/dev/null || true
        fi
        sleep 0.1
        procs=$({
            echo "$procs"
            _slurm_procs "$dir" ${netns[@]+"${netns[@]}"}
        } | sort -u | _slurm_alive) || true
    done
    if [ -n "$procs" ]; then
        echo "slurm_stop: still alive after KILL: ${procs//$'\n'/, }" >&2
        left=1
    fi
    # veths first (that removes both ends), then namespaces, then the bridge
    for name in ${links[@]+"${links[@]}"}; do
        case $name in *v[0-9]) ip link del "$name" 2>/dev/null || true ;; esac
    done
    for name in ${netns[@]+"${netns[@]}"}; do ip netns del "$name" 2>/dev/null || true; done
    for name in ${links[@]+"${links[@]}"}; do
        if ip link show "$name" >/dev/null 2>&1; then ip link del "$name" 2>/dev/null || true; fi
    done
    if [ -n "${SLURM_KEEP:-}" ]; then
        rm -rf "$dir/state" "$dir/spool" "$dir/tmp" "$dir/munge"
        [ -d "$dir" ] && echo "slurm_stop: logs kept in $dir/log" >&2
    else
        rm -rf "$dir"
    fi
    unset SLURM_DIR SLURM_CONF
    return "$left"
}

slurm_logs() { # [LINES]
    local f n=${1:-40}
    [ -n "${SLURM_DIR:-}" ] && [ -d "$SLURM_DIR/log" ] || return 0
    for f in "$SLURM_DIR"/log/*; do
        [ -s "$f" ] || continue
        echo "==> $f <=="
        tail -n "$n" "$f"
    done
}
