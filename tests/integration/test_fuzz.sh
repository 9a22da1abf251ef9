#!/bin/bash
# libFuzzer on the safetensors parsers (tests/fuzz/, docs/safetensors.md#fuzzing):
# tests/fuzz/build.sh builds st_header (bmt_st_parse and discovery), st_index
# (bmt_st_parse_index) and st_convert (bmt_st_convert) with clang
# -fsanitize=fuzzer,address,undefined into $BUILDDIR/fuzz. Every seed and every
# input of tests/fuzz/regressions/<target>/ (each one crashed a target once)
# runs through its target once; then each target fuzzes for a bounded time
# (FUZZ_SECONDS overrides it) from a copy of those inputs, so the checked-in
# corpus never grows. A crash, leak, sanitizer report or broken invariant fails
# with the reproducer, kept in $BUILDDIR/fuzz/crashes/<target>/, and the first
# lines of the report. Without clang or libFuzzer: "# skipped:".
. "$(dirname "$0")/lib.sh"

FUZZ=$BUILDDIR/fuzz
FZ=$SRC/tests/fuzz
# One process per target (libFuzzer's default; -jobs=1 -workers=1 would fork one
# child that logs to fuzz-0.log instead): 12, 12 and 6 s, run at the same time
# (below), about 28 s with the build on a 2-core machine.
declare -A BUDGET=([st_header]=12 [st_index]=12 [st_convert]=6)
# tests/run sets ASAN_OPTIONS=handle_segv=0 for other tests; here ASan reports a
# SEGV with its stack, and leaks count.
export ASAN_OPTIONS=handle_segv=1:detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1
# An input of at most 4 KB may not take one allocation of 64 MB (memory is
# O(header): a bigger one is an amplification bug), nor 10 s.
LIMITS="-malloc_limit_mb=64 -rss_limit_mb=2048 -timeout=10"
export FUZZ FZ LIMITS

reason=$("$FZ/build.sh" "$FUZZ" 2>"$TMP/build.err")
build_rc=$?
if [ $build_rc -eq 77 ]; then
    echo "# skipped: $reason"
    test_done
    exit
fi
export build_rc BUILD_ERR=$TMP/build.err

# The seeds and regression inputs of a target, one path a line.
inputs() { # target
    find "$FZ/seeds/$1" "$FZ/regressions/$1" -type f ! -name 'README*' 2>/dev/null | sort
}

# After a failed run: the start of the report (sanitizer, libFuzzer or a broken
# invariant) and the input: a checked-in one as it is, a new one kept outside the
# test's temp dir.
report() { # target log [checked-in input]
    local t=$1 log=$2 repro=${3:-} keep
    grep -m1 -A12 -E 'invariant broken|^==[0-9]+== ?ERROR|runtime error:|^ERROR: libFuzzer|^SUMMARY' "$log" |
        cut -c1-200 | head -16
    if [ -n "$repro" ]; then
        echo "input: $repro"
        echo "rerun: $FUZZ/$t $repro"
        return
    fi
    repro=$(ls -t crash-* leak-* timeout-* oom-* slow-unit-* 2>/dev/null | head -1)
    if [ -n "$repro" ] && [ -f "$repro" ]; then
        keep=$FUZZ/crashes/$t
        mkdir -p "$keep" && cp "$repro" "$keep/" && repro=$keep/$(basename "$repro")
        echo "reproducer: $repro"
        echo "rerun: $FUZZ/$t $repro (fix it, then keep it in tests/fuzz/regressions/$t/)"
    else
        echo "no reproducer written; the log: $log"; tail -5 "$log"
    fi
}
export -f inputs report

test_expect_success "tests/fuzz/build.sh builds st_header, st_index and st_convert with libFuzzer, ASan, UBSan" '
    { test "$build_rc" -eq 0 || { cat "$BUILD_ERR"; false; }; } &&
    test -x "$FUZZ/st_header" && test -x "$FUZZ/st_index" && test -x "$FUZZ/st_convert"
'

# The timed runs start together in the background, each in a directory of
# its own (its corpus copy, log, status and any reproducer): about 12 s for
# the three on 2 cores, not 30 one after the other. Each one's test below waits
# for its status file.
if [ $build_rc -eq 0 ]; then
    for t in st_header st_index st_convert; do
        secs=${FUZZ_SECONDS:-${BUDGET[$t]}}
        mkdir -p "$TMP/fz-$t/corpus" && inputs $t | xargs cp -t "$TMP/fz-$t/corpus"
        (
            cd "$TMP/fz-$t" || exit
            rc=0
            with_timeout $((secs + 120)) "$FUZZ/$t" $LIMITS -max_total_time=$secs -max_len=4096 \
                -dict="$FZ/safetensors.dict" -print_final_stats=1 \
                -artifact_prefix="$PWD/" corpus >log 2>&1 || rc=$?
            echo $rc >rc.tmp && mv rc.tmp rc
        ) &
    done
fi

for t in st_header st_index st_convert; do
    export t
    test_expect_success "$t: every seed and regression input runs once, clean" '
        inputs $t >list && test "$(wc -l <list)" -ge 10 &&
        rc=0 && xargs "$FUZZ/$t" $LIMITS <list >log 2>&1 || rc=$? &&
        if [ $rc -ne 0 ]; then
            report $t log "$(sed -n "s/^Running: //p" log | tail -1)"; false
        fi &&
        test "$(grep -c "^Executed " log)" -eq "$(wc -l <list)"
    '
    secs=${FUZZ_SECONDS:-${BUDGET[$t]}}
    export secs
    test_expect_success "$t: ${secs}s of fuzzing from the seeds: no crash, leak, UB or broken invariant" '
        cd "$TMP/fz-$t" &&
        for i in $(seq $(((secs + 150) * 10))); do test -f rc && break; sleep 0.1; done &&
        { test -f rc || { echo "the timed run wrote no status"; tail -5 log; false; }; } &&
        rc=$(cat rc) &&
        if [ $rc -ne 0 ]; then
            echo "$t exited with status $rc"; report $t log; false
        fi &&
        runs=$(sed -n "s/^stat::number_of_executed_units: *//p" log) &&
        echo "$runs" >"$TMP/runs.$t" && test "$runs" -ge 1000
    '
    if [ -s "$TMP/runs.$t" ]; then echo "# $t: $(cat "$TMP/runs.$t") runs in ${secs}s"; fi
done

test_done
