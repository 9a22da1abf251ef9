#!/bin/bash
# GPU tests (make check-gpu, on a machine with >= 1 GPU): every kern_* of
# runtime/kernels.h on cuda against its cpu reference, through
# $BUILDDIR/tests/gpu/kernels_check (tests/gpu/kernels_check.c). Each of its
# points becomes one point here; its "#" lines (throughput) are passed through.
. "$(dirname "$0")/../integration/lib.sh"

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "${gpus:-0}" -lt 1 ]; then
    echo "# this machine shows ${gpus:-0} GPUs; these tests need 1"
    test_expect_success "a machine with at least 1 GPU (nvidia-smi -L)" 'false'
    test_done
    exit
fi

CHECK=$BUILDDIR/tests/gpu/kernels_check
if [ ! -x "$CHECK" ]; then
    test_expect_success "kernels_check is built ($CHECK)" 'false'
    test_done
    exit
fi

log=$TMP/kernels_check.log
with_timeout 600 "$CHECK" >"$log" 2>&1
rc=$?
while IFS= read -r line; do
    case $line in
    "ok "*) _report 0 "kernels_check: ${line#ok * - }" ;;
    "not ok "*)
        : >"$TMP/.out"
        _report 1 "kernels_check: ${line#not ok * - }"
        ;;
    "#"*) echo "$line" ;;
    esac
done <"$log"
test_expect_success "kernels_check exits 0 with a plan (exit status $rc)" "
    test $rc -eq 0 && grep -qE '^1\.\.[1-9]' '$log'
"
test_done
