#!/bin/bash
# GPU tests (make check-gpu, on a machine with >= 1 GPU): every CUDA layer of
# the GPT-2 example (nn/ops_cuda.h) against its CPU twin, through
# $BUILDDIR/tests/gpu/gpt2_ops_check (tests/gpu/gpt2_ops_check.c: bounds there).
. "$(dirname "$0")/../integration/lib.sh"
gpu_require 1
test_tap_program gpt2_ops_check 600 "$BUILDDIR/tests/gpu/gpt2_ops_check"
test_done
