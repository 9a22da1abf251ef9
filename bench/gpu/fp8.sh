#!/bin/bash
# bench/gpu/fp8.sh — on the GPU machine: GPT-2's --fp8 1 next to bf16, in one
# call (docs/fp8.md, issue 24). STAGES picks what runs, in this order:
#   test   tests/run gpu test_fp8 test_gpt2 (the kernels, the layer against the
#          cpu emulation, the trainer's FP8 run against its cpu emulation)
#          (GPT2_ONLY="6 7": only those tests of test_gpt2, TEST_ONLY)
#   profile bench/gpu/profile.sh with --fp8 1 (PROF, default d48:8:0:4): the
#          GPU time of one step by kernel
#   speed  bench/gpu/gpt2.sh with RUNS (default: d48 b8 1x1, checkpointing 0:
#          bf16, --fp8 1 (delayed scaling), --fp8 1 --fp8-scaling current;
#          checkpointing 1: bf16, --fp8 1; no peer unless PEER_RUNS >= 1): the
#          table's rows side by side, then the FP8 / bf16 tokens/s ratios
#   curve  CURVE_STEPS (500) steps of real text, bf16 and --fp8 1 from the
#          same seed and batches (MODEL d48, b 8, T 1024, no checkpointing;
#          CURVE="0:1337 1:1337" the runs, fp8:seed, the first two compared):
#          TEXT (default .bench-text/pydocs.txt.xz, Python 3.11's documentation
#          sources, 11 MB, byte-level tokens by gpt2 --prepare: 500 steps of
#          8192 tokens read 4.1M of its 10M, less than one epoch); the losses
#          every 50 steps, the validation loss every 100, and the differences
#   carry: .device-deps .bench-text
# Logs under $OUT; a table last.
set -u
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
STAGES=${STAGES:-"test speed curve"}
MODEL=${MODEL:-d48} CURVE_STEPS=${CURVE_STEPS:-500} TEXT=${TEXT:-.bench-text/pydocs.txt.xz}
export NCCL_NVLS_ENABLE=0
t0=$SECONDS
bash bench/gpu/build.sh || { echo "fp8.sh: the build failed ($OUT/build.log)"; exit 1; }
summary=()
if [[ " $STAGES " == *" test "* ]]; then
    for s in test_fp8 test_gpt2; do
        t=$SECONDS
        only=
        [ $s = test_gpt2 ] && only=${GPT2_ONLY:-}
        TEST_ONLY=$only tests/run gpu "$s" >"$OUT/$s.txt" 2>&1
        cp build/test-logs/gpu_$s.log "$OUT/" 2>/dev/null
        summary+=("$(printf '%-12s %s  (%d s)' "$s" "$(tail -1 "$OUT/$s.txt")" $((SECONDS - t)))")
        echo "${summary[-1]}"
    done
    grep -h "largest c measured\|against bf16\|largest step difference\|cpu f32" "$OUT"/gpu_test_*.log | head -30
fi
if [[ " $STAGES " == *" profile "* ]]; then
    PROF=${PROF:-$MODEL:8:0:4} PROF_ARGS="--fp8 1" PROF_TIMEOUT=150 bash bench/gpu/profile.sh >"$OUT/profile.txt" 2>&1
    head -32 "$OUT/profile.txt"
fi
if [[ " $STAGES " == *" speed "* ]]; then
    RUNS=${RUNS:-"$MODEL:8:1x1:0 $MODEL:8:1x1:0:--fp8,1 $MODEL:8:1x1:0:--fp8,1,--fp8-scaling,current $MODEL:8:1x1:1 $MODEL:8:1x1:1:--fp8,1"} \
        PEER_RUNS=${PEER_RUNS:-0} SKIP_BUILD=1 STEPS=${STEPS:-13} bash bench/gpu/gpt2.sh >"$OUT/speed.txt" 2>&1
    sed -n '/^== GPT-2/,$p' "$OUT/speed.txt"
    # FP8 / bf16 per configuration: a row with --fp8 1 against the last bf16 row before it
    awk '/ours/ { match($0, /[0-9.]+ tok\/s/); tok = substr($0, RSTART, RLENGTH) + 0
                  if ($0 !~ /--fp8 1/) { prev = tok; next }
                  how = $0 ~ /--fp8-scaling current/ ? "current" : "delayed"
                  printf "fp8 (%s) / bf16 (%s %s): x%.3f\n", how, $1, $4 " " $5, tok / prev }' \
        "$OUT/gpt2-table.txt" | tee "$OUT/ratio.txt"
fi
if [[ " $STAGES " == *" curve "* ]]; then
    xz -dc "$TEXT" >/tmp/curve.txt && build/bin/gpt2 --prepare /tmp/curve.txt --out /tmp/curve \
        --val-fraction 0.02 >"$OUT/prepare.log" 2>&1 || { echo "fp8.sh: no text ($TEXT): carry .bench-text"; exit 1; }
    logs=()
    for run in ${CURVE:-0:1337 1:1337}; do
        f=${run%:*} seed=${run#*:} t=$SECONDS
        timeout 400 build/bin/bmlaunch --metrics-port 0 --device cuda -n 1 -- build/bin/gpt2 \
            --model "$MODEL" -b 8 -t 1024 --ckpt 0 --data /tmp/curve_train.bin --val /tmp/curve_val.bin \
            --steps "$CURVE_STEPS" --lr 3e-4 --warmup 50 --lr-min-frac 0.1 --eval-every 100 \
            --eval-batches 8 --seed $seed --fp8 $f >"$OUT/curve-fp8-$f-seed$seed.log" 2>&1
        echo "curve --fp8 $f --seed $seed: exit $? in $((SECONDS - t)) s"
        grep "fp8:" "$OUT/curve-fp8-$f-seed$seed.log" | tee -a "$OUT/curve-fp8-stats.txt"
        logs+=("$OUT/curve-fp8-$f-seed$seed.log")
    done
    [ ${#logs[@]} -ge 2 ] && python3 - "${logs[0]}" "${logs[1]}" <<'PY' | tee "$OUT/curve.txt"
import re, sys
def read(f):
    tr, va = {}, {}
    for l in open(f):
        m = re.search(r"^0: step +(\d+)/\d+ \| loss ([0-9.naif]+)", l)
        if m: tr[int(m.group(1))] = float(m.group(2))
        m = re.search(r"^0: step +(\d+)/\d+ \| val loss ([0-9.naif]+)", l)
        if m: va[int(m.group(1))] = float(m.group(2))
    return tr, va
(t0, v0), (t1, v1) = read(sys.argv[1]), read(sys.argv[2])
print("step | %s train (mean of 50) | %s train | diff | val | val | diff" % tuple(a.split("/")[-1][6:-4] for a in sys.argv[1:3]))
worst = 0.0
for s in range(50, max(t0) + 1, 50):
    a = [t0[i] for i in range(s - 49, s + 1) if i in t0]; b = [t1[i] for i in range(s - 49, s + 1) if i in t1]
    if len(a) < 50 or len(b) < 50: continue
    ma, mb = sum(a) / 50, sum(b) / 50
    line = "%4d | %.4f | %.4f | %+.2f%%" % (s, ma, mb, 100 * (mb - ma) / ma)
    if s in v0 and s in v1:
        line += " | %.4f | %.4f | %+.2f%%" % (v0[s], v1[s], 100 * (v1[s] - v0[s]) / v0[s])
        if s >= 100: worst = max(worst, abs(v1[s] - v0[s]) / v0[s])
    print(line)
print("largest |val difference| from step 100 on: %.2f%%" % (100 * worst))
PY
fi
echo "== fp8.sh $(nvidia-smi -L | head -1 | sed 's/ (UUID.*//'): $((SECONDS - t0)) s"
printf '%s\n' "${summary[@]}"
cat "$OUT/ratio.txt" 2>/dev/null
tail -1 "$OUT/curve.txt" 2>/dev/null
cat "$OUT/curve-fp8-stats.txt" 2>/dev/null
python3 -c "import torchao; print('torchao', torchao.__version__)" 2>/dev/null || echo "torchao: not installed on this machine"
