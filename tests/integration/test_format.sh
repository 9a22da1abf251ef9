#!/bin/bash
# Every C source and header is formatted by the checked-in .clang-format
# (STYLE.md 10). Fix with `make format`. And the engine's layers call down only
# (STYLE.md 13): storage (block.o) < schedule (schedule.o) < update (optim.o),
# checked on the objects' undefined symbols.
. "$(dirname "$0")/lib.sh"

test_expect_success "every C file matches .clang-format (make format fixes it)" '
    command -v clang-format >/dev/null || { echo "clang-format is not installed"; false; }
    cd "$SRC" && files=$(git ls-files "*.c" "*.h" "*.cu") && test -n "$files" &&
    # a few files per clang-format run, two runs at once (one run per file
    # took 18 s of this 2-core machine, mostly starting clang-format); each
    # unformatted file is named in "FILE:LINE:COL: error: ..." lines, and a
    # run that failed without naming one fails the test with its output
    rc=0 && out=$(printf "%s\n" $files | xargs -P2 -n 16 clang-format --dry-run --Werror 2>&1) ||
        rc=$? &&
    bad=$(echo "$out" | sed -n "s/^\([^:]*\):[0-9]*:[0-9]*: error:.*/\1/p" | sort -u | tr "\n" " ") &&
    { test -z "$bad" || { echo "not formatted: $bad"; false; }; } &&
    { test $rc -eq 0 || { echo "clang-format failed (xargs status $rc):"; echo "$out" | head -20; false; }; }
'
# layer_refs OBJ OTHER...: the symbols OBJ uses that one of the OTHERs defines
layer_refs() {
    local obj=$BUILDDIR/runtime/$1.o o
    shift
    for o in "$@"; do
        comm -12 <(nm -u "$obj" | awk '{print $2}' | sort -u) \
            <(nm --defined-only -g "$BUILDDIR/runtime/$o.o" | awk '{print $3}' | sort -u)
    done
}

test_expect_success "the engine's layers call down only: block.o uses nothing of schedule.o, optim.o or ckpt.o; schedule.o nothing of optim.o or ckpt.o; optim.o nothing of ckpt.o" '
    for o in block schedule optim ckpt; do test -f $BUILDDIR/runtime/$o.o || { echo "no $o.o"; exit 1; }; done &&
    up=$(layer_refs block schedule optim ckpt; layer_refs schedule optim ckpt; layer_refs optim ckpt) &&
    { test -z "$up" || { echo "calls up a layer: $up"; false; }; } &&
    test -n "$(layer_refs optim schedule block)" && test -n "$(layer_refs schedule block)"
'
test_done
