#!/bin/bash
# bench/gpu/master_ab.sh — on the GPU machine: the trainers with each
# --master-only mode of bf16 parameters (0: bf16 shard and f32 master; 1: the
# f32 master alone, rounded at each gather; 2: the master split into the bf16
# shard and its low 16 bits, runtime/optim.c), one build, same shapes, data and
# seed, the modes interleaved round by round so that drift shows. Prints per run
# the median step time over steps 4..STEPS, the last step's loss and the peak
# memory, then a table.
#
#   RUNS="gpt2:d48:8:0 llama:llama3.2-1b:2:0"   trainer:model:micro-batch:checkpointing
#   MODES="1 2 0"   the --master-only values, in the order each round runs them
#   ROUNDS=2  STEPS=13  SKIP_BUILD=1 (reuse the build)
# GPT-2 runs at T 1024, Llama at T 4096 (TL_T). carry: .device-deps.
set -u
OUT=${OUT:-$PWD/gpu-out}
STEPS=${STEPS-13} ROUNDS=${ROUNDS-2} MODES=${MODES-"1 2 0"} TL_T=${TL_T:-4096}
RUNS=${RUNS:-"gpt2:d48:8:0 llama:llama3.2-1b:2:0"}
case $STEPS in '' | *[!0-9]*) STEPS=0 ;; esac
[ "$STEPS" -ge 4 ] || { echo "master_ab.sh: STEPS must be a whole number >= 4, e.g. STEPS=13" >&2; exit 2; }
case $ROUNDS in '' | *[!0-9]* | 0) echo "master_ab.sh: ROUNDS must be a whole number >= 1, not '$ROUNDS'" >&2; exit 2 ;; esac
for m in $MODES; do
    case $m in 0 | 1 | 2) ;; *) echo "master_ab.sh: MODES holds --master-only values 0, 1 or 2, not '$m'" >&2; exit 2 ;; esac
done
for r in $RUNS; do
    IFS=: read -r tr model b ck <<<"$r"
    case $tr in gpt2 | llama) ;; *) echo "master_ab.sh: '$r': the trainer is gpt2 or llama" >&2; exit 2 ;; esac
done
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
if [ "${SKIP_BUILD:-0}" != 1 ]; then
    bench/gpu/build.sh || { echo "master_ab.sh: the tree does not build ($OUT/build.log)"; exit 1; }
fi
. "$(dirname "$0")/tokens.sh" # DATA (GPT-2), DATA32 (Llama 3)

# one run: prints "ms loss peak-GiB"
run() {
    local tr=$1 model=$2 b=$3 ck=$4 mode=$5 log=$6 t=1024 data=$DATA
    [ "$tr" = llama ] && t=$TL_T data=$DATA32
    timeout 400 build/bin/bmlaunch --metrics-port 0 --device cuda -g 1 -n 1 -- \
        build/bin/$tr --model "$model" -b "$b" -t $t --steps "$STEPS" --data "$data" \
        --ckpt "$ck" --lr 3e-4 --warmup 0 --seed 1 --master-only "$mode" >"$log" 2>&1
    python3 "$(dirname "$0")/step_stats.py" "$log"
}

rows=()
for r in $RUNS; do
    IFS=: read -r tr model b ck <<<"$r"
    for ((k = 1; k <= ROUNDS; k++)); do
        for mode in $MODES; do
            read -r ms loss peak <<<"$(run "$tr" "$model" "$b" "$ck" "$mode" "$OUT/mo-$tr-$model-b$b-ck$ck-m$mode-$k.log")"
            rows+=("$(printf '%-5s %-12s b%-3s ckpt %s round %d | --master-only %s | %8s ms | loss %-8s | peak %6s GiB' \
                "$tr" "$model" "$b" "$ck" "$k" "$mode" "$ms" "$loss" "$peak")")
            echo "${rows[-1]}"
        done
    done
done
echo
echo "== --master-only A/B, $(nvidia-smi -L | head -1 | sed 's/ (UUID.*//')"
printf '%s\n' "${rows[@]}" | tee "$OUT/mo-table.txt"
