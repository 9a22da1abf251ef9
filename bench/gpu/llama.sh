#!/bin/bash
# bench/gpu/llama.sh — on the GPU machine: our Llama trainer (examples/llama,
# CUDA path) next to PyTorch FSDP2 + torch.compile (bench/gpu/fsdp2_llama.py)
# on the same shapes, batch and sequence length, in the same call. Prints a
# table last: config, layout, step ms, tokens/s, MFU against the datasheet's
# bf16 peak (989 TFLOP/s for an H200) and against the bf16 matmul ceiling
# measured first in the same call (tests/gpu/gpt2_ops_check --ceiling), peak
# GPU memory per rank, and the ratio of tokens/s to the peer's. MFU counts
# 6 N + 6 L C T FLOPs per token for both (N all parameters, the tied
# embedding once: llama_flops_per_token), so the two columns compare.
#   RUNS="llama3.2-1b:2:4096:1x1:0 ..."  model:micro-batch:T:layout:checkpointing[:budget[:args]]
#                            (default below: Llama 3.2 1B and 3B at T 2048 and
#                            4096, with and without checkpointing, one GPU);
#                            budget: ours with --ckpt-budget MIB (selective
#                            checkpointing; the peer checkpoints every layer);
#                            args: more options of ours, commas for spaces
#                            (e.g. llama3.2-1b:2:4096:1x1:0::--fp8,1; the
#                            peer runs as without them)
#   STEPS=13                 steps per run; the median of the last STEPS-3 is kept
#   SKIP_BUILD=1             reuse build/
#   PEER_COMPILE=0           the peer without torch.compile
#   carry: .device-deps (Debian libjansson-dev, see docs/building.md)
# Peak memory: ours is libbmt's own accounting (bmt_alloc), the peer's
# torch.cuda.max_memory_allocated; neither counts NCCL's buffers or the context.
set -u
STEPS=${STEPS-13}
case $STEPS in '' | *[!0-9]*) STEPS=0 ;; esac
[ "$STEPS" -ge 4 ] || { echo "llama.sh: STEPS must be a whole number >= 4 (the first 3 steps are warm-up), e.g. STEPS=13" >&2; exit 2; }
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
RUNS=${RUNS:-"llama3.2-1b:2:4096:1x1:0 llama3.2-1b:2:4096:1x1:1 llama3.2-1b:4:2048:1x1:0 llama3.2-3b:1:4096:1x1:0 llama3.2-3b:1:4096:1x1:1"}
if [ "${SKIP_BUILD:-0}" != 1 ]; then
    bench/gpu/build.sh || exit 1
fi
. "$(dirname "$0")/tokens.sh" # DATA32: Llama 3's vocabulary

CEIL=$(build/tests/gpu/gpt2_ops_check --ceiling 2>&1 | sed -n 's/^ceiling_tflops //p')
echo "bf16 matmul ceiling: ${CEIL:-?} TFLOP/s"
# FLOPs per token of a preset at T (the trainer's formula)
flops() {
    python3 - "$1" "$2" <<'PY'
import sys
L, C, NH, NKV, F, V = {"llama3.2-1b": (16, 2048, 32, 8, 8192, 128256),
                       "llama3.2-3b": (28, 3072, 24, 8, 8192, 128256)}[sys.argv[1]]
hd, T = C // NH, int(sys.argv[2])
N = V * C + L * (2 * C + C * NH * hd + 2 * C * NKV * hd + NH * hd * C + 3 * C * F) + C
print(6 * N + 6 * L * NH * hd * T)
PY
}
rows=()
for run in $RUNS; do
    IFS=: read -r model b T layout ck budget args <<<"$run"
    args=${args//,/ }
    g=${layout%x*} n=${layout#*x}
    w=$((g * n))
    tag=$model-b$b-t$T-$layout-ckpt$ck${budget:+-budget$budget}${args:+-$(echo $args | tr -c 'a-zA-Z0-9.\n' _)}
    fpt=$(flops "$model" "$T")
    timeout 500 build/bin/bmlaunch --metrics-port 0 --device cuda -g $g -n $n -- build/bin/llama \
        --model $model -b $b -t $T --steps $STEPS --data $DATA32 --ckpt $ck --lr 3e-4 --warmup 0 \
        ${budget:+--ckpt-budget $budget} $args >"$OUT/ours-$tag.log" 2>&1
    rc=$?
    ours=$(python3 - "$OUT/ours-$tag.log" $b $T $w "$fpt" "${CEIL:-0}" <<'PY'
import re, statistics, sys
log, b, t, w, fpt, ceil = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6])
ms, peak = [], 0.0
for l in open(log):
    m = re.search(r"step +(\d+)/\d+ \| .*\| ([\d.]+) ms \| .*mem [\d.]+ MiB \(peak ([\d.]+)\)", l)
    if m and int(m.group(1)) > 3:
        ms.append(float(m.group(2))); peak = max(peak, float(m.group(3)))
if not ms:
    print("- - - - -"); sys.exit()
s = statistics.median(ms)
tok = b * t * w / (s / 1e3)
mfu = 100 * tok * fpt / w / 989e12
mc = "%.1f" % (100 * tok * fpt / w / (ceil * 1e12)) if ceil > 0 else "-"
print("%.1f %.0f %.1f %s %.2f" % (s, tok, mfu, mc, peak / 1024))
PY
)
    ptag=$model-b$b-t$T-$layout-ckpt$ck # the peer's run, once per call for every budget of ours
    [ -f "$OUT/fsdp2-$ptag.log" ] ||
        timeout 600 python3 -m torch.distributed.run --standalone --nproc_per_node $w bench/gpu/fsdp2_llama.py \
            --model $model -b $b -t $T --steps $STEPS --groups $g $([ "$ck" = 1 ] && echo --ckpt) \
            $([ "${PEER_COMPILE:-1}" = 0 ] && echo --no-compile) >"$OUT/fsdp2-$ptag.log" 2>&1
    peer=$(sed -n 's/.*step_ms=\([0-9.]*\) tok_s=\([0-9]*\) mem_gib=\([0-9.]*\) held_gib=\([0-9.]*\).*/\1 \2 \3 \4/p' "$OUT/fsdp2-$ptag.log")
    read -r oms otok omfu omfuc omem <<<"$ours"
    read -r pms ptok pmem pheld <<<"${peer:-- - - -}"
    pmfu=$(awk -v t="$ptok" -v f="$fpt" -v w="$w" 'BEGIN { if (t+0 > 0) printf "%.1f", 100 * t * f / w / 989e12; else print "-" }')
    ratio=$(awk -v a="$otok" -v b="$ptok" 'BEGIN { if (a+0 > 0 && b+0 > 0) printf "%.2f", a / b; else print "-" }')
    rows+=("$(printf '%-11s b%-2s T%-5s %-4s ckpt %s | ours %8s ms %8s tok/s MFU %5s%% (ceiling %5s%%) mem %6s GiB | fsdp2 %8s ms %8s tok/s MFU %5s%% mem %6s GiB | x%s (rc %s)' \
        $model $b $T $layout "$ck${budget:+ budget $budget MiB}${args:+ $args}" "$oms" "$otok" "$omfu" "$omfuc" "$omem" "$pms" "$ptok" "$pmfu" "$pmem" "$ratio" $rc)")
    echo "${rows[-1]}"
done
echo
echo "== Llama, $(nvidia-smi -L | head -1 | sed 's/ (UUID.*//'), $(nvidia-smi -L | wc -l) GPUs"
printf '%s\n' "${rows[@]}" | tee "$OUT/llama-table.txt"
