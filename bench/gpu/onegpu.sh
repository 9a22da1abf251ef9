#!/bin/bash
# bench/gpu/onegpu.sh — what one GPU can check (tests/gpu/test_engine.sh and
# test_nccl.sh need two): build (bench/gpu/build.sh; carry .device-deps), then
# engine_check at cuda 1x1 in its variants (f32, bf16, bf16 master_only 1 and 2,
# --variants, a NaN step with clipping and warm-up, --kernel-check), then
# tests/gpu/test_gpt2.sh (the HF oracle at 1x1, from_pretrained of a trainer
# checkpoint, the trainer's bitwise variants). Logs under $OUT; one line per
# part and the failing points last.
set -u
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
T0=$(date +%s)
t() { echo "t=$(($(date +%s) - T0))s"; }
bench/gpu/build.sh || { echo BUILD FAILED; exit 1; }
echo "built $(t)"
EC=build/tests/progs/engine_check
L=build/bin/bmlaunch
run_ec() { # tag args...
    local tag=$1; shift
    timeout 150 $L --device cuda -n 1 --timeout 60 -- $EC "$@" >$OUT/ec-$tag.log 2>&1
    echo "ec $tag rc=$? $(grep -c '^0: ok' $OUT/ec-$tag.log) ok, $(grep -c FAIL $OUT/ec-$tag.log) FAIL: $(grep '^0: engine_check:' $OUT/ec-$tag.log | tail -1) $(t)"
    grep FAIL $OUT/ec-$tag.log | head -5
}
run_ec f32
run_ec bf16 --dtype bf16
run_ec bf16mo --dtype bf16 --master-only
run_ec bf16split --dtype bf16 --master-split
run_ec variants --variants
run_ec nan --nan-step 7 --clip 0.3 --warmup 5
run_ec kernels --kernel-check
timeout 330 tests/run gpu test_gpt2 >$OUT/test_gpt2.txt 2>&1
echo "test_gpt2: $(tail -1 $OUT/test_gpt2.txt) $(t)"
cp build/test-logs/gpu_test_gpt2.log $OUT/ 2>/dev/null
grep '^not ok' -A12 $OUT/gpu_test_gpt2.log | head -40
echo "== done $(t)"
