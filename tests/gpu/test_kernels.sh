#!/bin/bash
# GPU tests (make check-gpu, on a machine with >= 1 GPU): every kern_* of
# runtime/kernels.h on cuda against its cpu reference, through
# $BUILDDIR/tests/gpu/kernels_check (tests/gpu/kernels_check.c). Each of its
# points becomes one point here; its "#" lines (throughput) are passed through.
. "$(dirname "$0")/../integration/lib.sh"
gpu_require 1
test_tap_program kernels_check 600 "$BUILDDIR/tests/gpu/kernels_check"
test_done
