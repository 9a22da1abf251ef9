#!/bin/bash
# scripts/check-sanitize.sh — make check-sanitize: the CPU suite under the
# sanitizers, in build directories of their own (docs/building.md):
#   ASan + UBSan  NO_CUDA=1 ASAN=1 in $BUILDDIR-asan: the unit tests and the
#                 integration tests but the load tests (the 1000-rank ones: too
#                 slow under ASan on 2 cores), the fuzzers (they carry their own
#                 sanitizers) and the format and docs checks (no code of ours runs);
#                 halt_on_error=1 (tests/run), LeakSanitizer at every exit;
#   TSan          NO_CUDA=1 TSAN=1 in $BUILDDIR-tsan: bmlaunch's collector and the
#                 push plugin (test_monitor, without its load test) and the async
#                 checkpoint writer (test_trust's async-against-sync test), the
#                 threaded parts.
# Ends with one line "N passed, N failed" for both.
set -u
cd "$(dirname "$0")/.."
BUILDDIR=${BUILDDIR:-build}
make=${MAKE:-make}
jobs=${JOBS:-$(nproc)}
total_p=0 total_f=0
run_suite() { # label builddir knob suite
    local label=$1 dir=$2 knob=$3 suite=$4 log
    log=$(mktemp)
    echo "== $label: building $dir ($knob=1 NO_CUDA=1)"
    if ! $make -s --no-print-directory -j"$jobs" NO_CUDA=1 "$knob=1" BUILDDIR="$dir" all >"$log" 2>&1; then
        tail -30 "$log"
        echo "not ok - the $label build failed"
        total_f=$((total_f + 1))
        rm -f "$log"
        return
    fi
    BUILDDIR=$dir tests/run "$suite" | tee "$log"
    local s
    s=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -1)
    if [ -z "$s" ]; then
        total_f=$((total_f + 1))
    else
        total_p=$((total_p + ${s%% *}))
        s=${s#* passed, }
        total_f=$((total_f + ${s%% *}))
    fi
    rm -f "$log"
}
run_suite "ASan+UBSan" "$BUILDDIR-asan" ASAN sanitize
run_suite "TSan" "$BUILDDIR-tsan" TSAN tsan
echo "$total_p passed, $total_f failed"
[ "$total_f" -eq 0 ]
