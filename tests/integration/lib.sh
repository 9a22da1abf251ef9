# tests/integration/lib.sh — a small sharness-style harness speaking TAP.
#
#   . "$(dirname "$0")/lib.sh"
#   test_expect_success "what it shows" 'commands && more commands'
#   test_expect_code 3 "what" 'command'      # the body's exit status must be 3
#   test_must_fail command args              # inside a body: fails unless command fails
#   exits 1 command args                     # inside a body: command exits 1 (stderr in ./err)
#   test_done                                # prints the plan; exit 1 if anything failed
#
# TEST_ONLY="3 7 12" runs only those tests (the others print "ok N # skip").
# Bodies run in a subshell under `set -e`, each in a fresh directory under $TMP. Variables for the bodies: $BMLAUNCH, $PROGS
# (test programs), $BUILDDIR, $SRC (the source tree).
# Helpers for the metrics tests: free_port, start_job ARGS (bmlaunch in the background, URL and JOB_PID set).
# quoted_after FILE CMD: what a doc shows as CMD's output (docs are checked against the binaries).
set -u
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILDDIR=${BUILDDIR:-build}
case $BUILDDIR in /*) ;; *) BUILDDIR=$SRC/$BUILDDIR ;; esac
BMLAUNCH=$BUILDDIR/bin/bmlaunch
PROGS=$BUILDDIR/tests/progs
export SRC BUILDDIR BMLAUNCH PROGS
TMP=$(mktemp -d "${TMPDIR:-/tmp}/bmt-test.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
test_count=0
test_failures=0

_report() { # status description
    test_count=$((test_count + 1))
    if [ "$1" -eq 0 ]; then
        echo "ok $test_count - $2"
    else
        test_failures=$((test_failures + 1))
        echo "not ok $test_count - $2"
        if [ -s "$TMP/.out" ]; then sed -e 's/^/#   /' "$TMP/.out" | tail -30; fi
    fi
    # where a suite's time goes: a test body that took 10 s or more says so
    if [ -n "${_body_ms:-}" ] && [ "$_body_ms" -ge 10000 ]; then
        printf '#   took %d.%d s\n' $((_body_ms / 1000)) $((_body_ms % 1000 / 100))
    fi
    _body_ms=
}

_now_ms() { local t=${EPOCHREALTIME/[.,]/}; echo $((t / 1000)); }

_run_body() { # body: runs in a fresh directory of its own
    local dir=$TMP/t$((test_count + 1)) t0
    mkdir -p "$dir"
    t0=$(_now_ms)
    (cd "$dir" && set -e && eval "$1") >"$TMP/.out" 2>&1
    local rc=$?
    _body_ms=$(($(_now_ms) - t0))
    return $rc
}

# True when TEST_ONLY is set and does not list the next test (which is then
# skipped), or when BMT_NO_LOAD_TESTS=1 and the next test is a load test (its
# description starts with "1000 ranks" or "256 ranks": too slow under a
# sanitizer on 2 cores).
_skipped() { # description
    if [ "${BMT_NO_LOAD_TESTS:-}" = 1 ] && [[ $1 == "1000 ranks"* || $1 == "256 ranks"* ]]; then
        test_count=$((test_count + 1))
        echo "ok $test_count # skip $1 (a load test; BMT_NO_LOAD_TESTS=1)"
        return 0
    fi
    [ -n "${TEST_ONLY:-}" ] || return 1
    case " $TEST_ONLY " in *" $((test_count + 1)) "*) return 1 ;; esac
    test_count=$((test_count + 1))
    echo "ok $test_count # skip $1 (TEST_ONLY)"
    return 0
}

test_expect_success() { # description body
    _skipped "$1" && return 0
    _run_body "$2"
    _report $? "$1"
}

test_expect_code() { # code description body
    local want=$1
    _skipped "$2" && return 0
    _run_body "$3"
    local got=$?
    if [ "$got" -ne "$want" ]; then
        echo "exit status $got, expected $want" >>"$TMP/.out"
        _report 1 "$2"
    else
        _report 0 "$2"
    fi
}

test_must_fail() { # command...
    if "$@"; then
        echo "test_must_fail: '$*' succeeded" >&2
        return 1
    fi
    return 0
}

# Run a command with a deadline; its exit status, 124 on timeout.
# exits CODE COMMAND...: COMMAND exits with status CODE (its stdout in ./stdout,
# its stderr in ./err, shown when the status differs).
exits() {
    local want=$1 rc=0
    shift
    "$@" >stdout 2>err || rc=$?
    [ "$rc" -eq "$want" ] || { echo "exit status $rc, expected $want: $*"; cat err; return 1; }
}

with_timeout() { # seconds command...
    local s=$1; shift
    timeout -k 5 "$s" "$@"
}

# Fails if any process listed in the pid files under dir is still alive.
no_survivors() { # dir
    local f pid
    for f in "$1"/pid.*; do
        [ -f "$f" ] || continue
        pid=$(cat "$f")
        if kill -0 "$pid" 2>/dev/null && ! grep -q '^State:.*Z' /proc/"$pid"/status 2>/dev/null; then
            echo "process $pid ($(basename "$f")) is still alive" >&2
            return 1
        fi
    done
}

gpu_require() { # count: with fewer GPUs (nvidia-smi -L), one failing point and exit
    local gpus
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    if [ "${gpus:-0}" -lt "$1" ]; then
        echo "# this machine shows ${gpus:-0} GPUs; these tests need $1"
        test_expect_success "a machine with at least $1 GPUs (nvidia-smi -L)" 'false'
        test_done
        exit
    fi
}

test_tap_program() { # label seconds program args...: each TAP point it prints is one
    # point here ("label: ..."), its "#" lines pass through, and a last point
    # says that it exited 0 with a plan.
    local label=$1 secs=$2 rc=0 line log
    shift 2
    log=$TMP/$label.log
    if [ ! -x "$1" ]; then
        test_expect_success "$label is built ($1)" 'false'
        return
    fi
    with_timeout "$secs" "$@" >"$log" 2>&1 || rc=$?
    while IFS= read -r line; do
        case $line in
        "ok "*) _report 0 "$label: ${line#ok * - }" ;;
        "not ok "*)
            : >"$TMP/.out"
            _report 1 "$label: ${line#not ok * - }"
            ;;
        "#"*) echo "$line" ;;
        esac
    done <"$log"
    test_expect_success "$label exits 0 with a plan (exit status $rc)" "
        test $rc -eq 0 && grep -qE '^1\.\.[1-9]' '$log' || { tail -5 '$log'; false; }
    "
}

# A TCP port free on 127.0.0.1 now (for --metrics-port and the like).
free_port() {
    /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# bmlaunch in the background with the given arguments; waits for its metrics
# URL, http or https (sets URL, JOB_PID). Output in job.out / job.err.
start_job() {
    "$BMLAUNCH" "$@" >job.out 2>job.err &
    JOB_PID=$!
    local i
    for i in $(seq 1200); do # 60 s: 1000 ranks start slowly on a loaded machine
        URL=$(sed -n 's|^bmlaunch: metrics on \(https\{0,1\}://[^ ]*\)/ .*|\1|p' job.err)
        [ -n "$URL" ] && return 0
        kill -0 $JOB_PID 2>/dev/null || break
        sleep 0.05
    done
    echo "no metrics URL from bmlaunch:" >&2
    cat job.err >&2
    return 1
}

quoted_after() { # file command: the lines a doc shows after "$ command" up to the closing ```
    awk -v cmd="\$ $2" '
        $0 == cmd { on = 1; next }
        on && /^```/ { exit }
        on { print }
    ' "$1"
}

test_done() {
    echo "1..$test_count"
    [ "$test_failures" -eq 0 ]
}
