#!/bin/bash
# PyTorch on GPUs under bmlaunch (issue 22, make check-gpu, >= 2 GPUs): the
# unmodified env:// program of tests/progs/torch_env.py with NCCL on
# cuda:LOCAL_RANK all-reduces over world, group and replica in layouts 1x2 and
# 2x1; an exception on rank 1 ends the job with rank 1 named.
# tests/integration/test_torch_launch.sh does the same with gloo on the CPU.
. "$(dirname "$0")/../integration/lib.sh"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
PY=${PYTHON:-python3}
TORCH_ENV=$SRC/tests/progs/torch_env.py
export PY TORCH_ENV

gpu_require 2
if ! $PY -c "import torch, torch.distributed as d; assert torch.cuda.is_available() and d.is_nccl_available()" 2>"$TMP/torch.err"; then
    sed 's/^/# /' "$TMP/torch.err" | tail -3
    test_expect_success "$PY has torch with CUDA and NCCL" 'false'
    test_done
    exit
fi

test_expect_success "1x2: NCCL env:// on cuda:0 and cuda:1, sums over world, group and replica" '
    with_timeout 300 $BMLAUNCH --metrics-port 0 --device cuda -g 1 -n 2 -- $PY $TORCH_ENV --backend nccl >out 2>err &&
    grep -q "^0: torch_env: rank 0 of 2: env ok; sums world 3 group 3 replica 1; .*; nccl on cuda:0\$" out &&
    grep -q "^1: torch_env: rank 1 of 2: env ok; sums world 3 group 3 replica 2; .*; nccl on cuda:1\$" out
'

test_expect_success "2x1: NCCL env://, groups of one, the replica spans both GPUs" '
    with_timeout 300 $BMLAUNCH --metrics-port 0 --device cuda -g 2 -n 1 -- $PY $TORCH_ENV --backend nccl >out 2>err &&
    grep -q "^0: torch_env: rank 0 of 2: env ok; sums world 3 group 1 replica 3; .*; nccl on cuda:0\$" out &&
    grep -q "^1: torch_env: rank 1 of 2: env ok; sums world 3 group 2 replica 3; .*; nccl on cuda:1\$" out
'

test_expect_success "an exception on rank 1 (NCCL): exit 1, rank 1 named with its traceback's last line" '
    { with_timeout 300 $BMLAUNCH --metrics-port 0 --device cuda -n 2 -- $PY $TORCH_ENV --backend nccl --fail 1 >out 2>err; rc=$?; } &&
    test $rc -eq 1 &&
    grep -q "^bmlaunch: job failed: rank 1 (pid [0-9]* on .*) exited with code 1\$" err &&
    grep -q "^    1: RuntimeError: torch_env: rank 1 fails on purpose\$" err
'

test_done
