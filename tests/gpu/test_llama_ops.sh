#!/bin/bash
# GPU tests (make check-gpu, on a machine with >= 1 GPU): the Llama layers on
# CUDA (nn/llama_ops_cuda.h: RMSNorm, RoPE, SwiGLU), the grouped-query
# flash attention (nn_cuda_flash_* of nn/ops_cuda.h) and the attention over a
# KV cache (nn_cuda_attention_cached) against their CPU twins
# (nn/llama_ops_cpu.h), through $BUILDDIR/tests/gpu/llama_ops_check
# (tests/gpu/llama_ops_check.c: bounds there).
. "$(dirname "$0")/../integration/lib.sh"
gpu_require 1
test_tap_program llama_ops_check 600 "$BUILDDIR/tests/gpu/llama_ops_check"
test_done
