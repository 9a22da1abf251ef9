#!/bin/bash
# GPU tests (make check-gpu, on a machine with >= 1 GPU): FP8 on CUDA (nn/fp8_cuda.h
# and nn_cuda_fp8_matmul) against nn/fp8.h, through $BUILDDIR/tests/gpu/fp8_check
# (tests/gpu/fp8_check.c: what is compared and the bounds).
. "$(dirname "$0")/../integration/lib.sh"
gpu_require 1
test_tap_program fp8_check 300 "$BUILDDIR/tests/gpu/fp8_check"
test_done
