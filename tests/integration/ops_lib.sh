# tests/integration/ops_lib.sh — what test_gpt2_ops.sh and test_llama_ops.sh share:
# an op checker (tests/progs/*_ops_check.c) against its oracle
# (tests/tools/*_ops_oracle.py, ops_oracle_common.py).
#
#   . "$(dirname "$0")/lib.sh"
#   PY=/usr/bin/python3 ORACLE=<the oracle> CHECK=<the checker> D=$TMP/ops
#   . "$(dirname "$0")/ops_lib.sh"
#
# Sourcing it ends the test with one failing point where $PY cannot import torch
# and numpy. The test writes the oracle's inputs and references to $D and the
# checker's results to $D/out; then, in the bodies:
#   compare_ops N CASE...     the cases compare ok on N lines
#   fails_only CASE TENSOR    on ./out, the comparison of CASE fails on TENSOR alone
#   perturbed CASE.TENSOR FACTOR
#                             the checker's results with that output perturbed
#                             (--perturb) fail the comparison of CASE on TENSOR alone
# and show, after a test, prints the lines of its last compare_ops as "#" lines.

if ! $PY -c 'import torch, numpy' 2>/dev/null; then
    test_expect_success "$PY can import torch and numpy (the oracle needs them)" 'false'
    test_done
    exit
fi

# compare_ops N CASE...: the oracle passes the cases with N lines, all ok (its
# output in $TMP/compare.out, shown after the test).
compare_ops() {
    local want=$1
    shift
    with_timeout 60 $PY "$ORACLE" compare "$D" "$D/out" "$@" >"$TMP/compare.out" &&
        test "$(grep -c "^ok " "$TMP/compare.out")" -eq "$want" &&
        ! grep -q "^not ok" "$TMP/compare.out" && grep -qx "1\\.\\.$want" "$TMP/compare.out"
}
show() { grep "ok " "$TMP/compare.out" | sed -e 's/^/#   /'; }

# fails_only CASE TENSOR: the comparison of CASE, on the results in ./out, fails
# on exactly one line, the one of TENSOR.
fails_only() {
    test_must_fail $PY "$ORACLE" compare "$D" out "$1" >compare.out &&
        test "$(grep -c "^not ok" compare.out)" -eq 1 &&
        grep -q "^not ok [0-9]* - $1\\.$2: " compare.out
}

# perturbed CASE.TENSOR FACTOR: the checker, with that output perturbed, writes
# ./out (its stdout in ./log), and the comparison of CASE fails on TENSOR alone.
perturbed() {
    "$CHECK" --perturb "$1" "$2" "$D/in" out >log &&
        fails_only "${1%%.*}" "${1#*.}"
}
