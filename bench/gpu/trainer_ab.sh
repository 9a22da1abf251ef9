#!/bin/bash
# bench/gpu/trainer_ab.sh — on the GPU machine: the GPT-2 trainer of this tree
# against the one of another commit, same shapes, same data, same seed, in the
# same call, runs interleaved (old, new, old, new, ...) so that drift shows.
# Prints per run the median step time over steps 4..STEPS and the last step's
# loss (the same seed and data give the same loss when the change keeps the
# numbers; a different loss says the change moved them), then a table.
#
#   OLD=build-old/src bench/gpu/trainer_ab.sh
#
#   OLD=DIR       a source tree of the other commit, e.g. made here with
#                 `mkdir -p build-old/src && git archive C | tar -x -C build-old/src`
#                 and carried (carry: build-old/src, .device-deps); built in place
#   RUNS="d12:16:0 d48:8:0"   model:micro-batch:checkpointing (one GPU each)
#   ROUNDS=2      times each pair runs
#   STEPS=13      steps per run (the first 3 are warm-up)
#   SKIP_BUILD=1  reuse both builds
# carry: .device-deps (docs/building.md) and the OLD folder.
set -u
OUT=${OUT:-$PWD/gpu-out}
STEPS=${STEPS-13} ROUNDS=${ROUNDS-2} OLD=${OLD-}
RUNS=${RUNS:-"d12:16:0 d48:8:0"}
case $STEPS in '' | *[!0-9]*) STEPS=0 ;; esac
[ "$STEPS" -ge 4 ] || { echo "trainer_ab.sh: STEPS must be a whole number >= 4, e.g. STEPS=13" >&2; exit 2; }
case $ROUNDS in '' | *[!0-9]* | 0) echo "trainer_ab.sh: ROUNDS must be a whole number >= 1, not '$ROUNDS'" >&2; exit 2 ;; esac
[ -n "$OLD" ] && [ -f "$OLD/Makefile" ] || {
    echo "trainer_ab.sh: OLD must name a source tree with a Makefile (got '$OLD'): see the header" >&2
    exit 2
}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
T=1024
if [ "${SKIP_BUILD:-0}" != 1 ]; then
    cp -r .device-deps "$OLD/" 2>/dev/null
    bench/gpu/build.sh &
    (cd "$OLD" && OUT="$OUT/old" bench/gpu/build.sh) &
    wait %1 || { echo "trainer_ab.sh: this tree does not build ($OUT/build.log)"; exit 1; }
    wait %2 || { echo "trainer_ab.sh: $OLD does not build ($OUT/old/build.log)"; exit 1; }
fi
. "$(dirname "$0")/tokens.sh" # DATA

# one run: prints "ms loss"
run() {
    local tree=$1 model=$2 b=$3 ck=$4 log=$5
    timeout 400 "$tree/build/bin/bmlaunch" --metrics-port 0 --device cuda -g 1 -n 1 -- \
        "$tree/build/bin/gpt2" --model "$model" -b "$b" -t $T --steps "$STEPS" --data "$DATA" \
        --ckpt "$ck" --lr 3e-4 --warmup 0 --seed 1 >"$log" 2>&1
    python3 "$(dirname "$0")/step_stats.py" "$log" | cut -d" " -f1,2
}

rows=()
for r in $RUNS; do
    IFS=: read -r model b ck <<<"$r"
    for ((k = 1; k <= ROUNDS; k++)); do
        read -r oms oloss <<<"$(run "$OLD" "$model" "$b" "$ck" "$OUT/ab-old-$model-b$b-ck$ck-$k.log")"
        read -r nms nloss <<<"$(run . "$model" "$b" "$ck" "$OUT/ab-new-$model-b$b-ck$ck-$k.log")"
        ratio=$(awk -v a="$oms" -v b="$nms" 'BEGIN { if (a+0 > 0 && b+0 > 0) printf "%.3f", a / b; else print "-" }')
        rows+=("$(printf '%-4s b%-3s ckpt %s round %d | old %8s ms loss %-8s | new %8s ms loss %-8s | old/new %s' \
            "$model" "$b" "$ck" "$k" "$oms" "$oloss" "$nms" "$nloss" "$ratio")")
        echo "${rows[-1]}"
    done
done
echo
echo "== trainer A/B, GPT-2 T=$T, $(nvidia-smi -L | head -1 | sed 's/ (UUID.*//'): old = $OLD"
printf '%s\n' "${rows[@]}" | tee "$OUT/ab-table.txt"
