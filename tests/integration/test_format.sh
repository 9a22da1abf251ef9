#!/bin/bash
# Every C source and header is formatted by the checked-in .clang-format
# (STYLE.md 10). Fix with `make format`.
. "$(dirname "$0")/lib.sh"

test_expect_success "every C file matches .clang-format (make format fixes it)" '
    command -v clang-format >/dev/null || { echo "clang-format is not installed"; false; }
    cd "$SRC" && files=$(git ls-files "*.c" "*.h" "*.cu") && test -n "$files" &&
    bad="" && for f in $files; do
        clang-format --dry-run --Werror "$f" 2>/dev/null || bad="$bad $f"
    done && { test -z "$bad" || { echo "not formatted:$bad"; false; }; }
'
test_done
