#!/bin/bash
# bench/gpu/gpt2.sh — on the GPU machine: our GPT-2 trainer (examples/gpt2, CUDA
# path) next to PyTorch FSDP2 (bench/gpu/fsdp2_gpt2.py) on the same shapes, batch
# and sequence length, in the same call. Prints a table last: config, layout,
# step ms, tokens/s, MFU against the datasheet's bf16 peak and against the
# measured bf16 matmul ceiling (an 8192^3 cuBLASLt product timed first in the
# same call: tests/gpu/gpt2_ops_check --ceiling), peak GPU memory per rank, our
# exposed communication (comm_wait_s / step, from the jsonl plugin), and the
# ratio of tokens/s to the peer's.
#   RUNS="d12:16:1x2:0 ..."  model:micro-batch:layout:checkpointing[:extra] (default
#                            below); extra: more trainer options with commas for
#                            spaces, e.g. d48:8:1x2:1:--master-only,1
#   STEPS=13                 steps per run; the median of the last STEPS-3 is kept
#   SKIP_BUILD=1             reuse build/ (a warm machine)
#   PEER_RUNS=1              runs of the peer per row (0: none, ours alone); the row keeps its fastest
#                            (FSDP2's step time moves by up to 50% between runs on
#                            this machine kind: the best of several is in its favour).
#                            Rows that differ only in our extra options share the
#                            peer's runs (made for the first of them), so
#                            "d48:8:1x2:1 d48:8:1x2:1:--gemm-tune,8" compares both
#                            with the same FSDP2 figures
#   carry: .device-deps (Debian libjansson-dev, see docs/building.md)
# Peak memory: ours is libbmt's own accounting (bmt_alloc: parameters, gathered
# blocks, gradients, optimizer, activations, workspace; all kinds at once); the
# peer's is torch.cuda.max_memory_allocated. "held" is what each held from the
# device at most: ours, its cudaMalloc'd buffers and its stream-ordered pool's
# largest reservation (the trainer's last line); the peer's,
# torch.cuda.max_memory_reserved. Neither counts NCCL's buffers or the CUDA context.
set -u
STEPS=${STEPS-13} PEER_RUNS=${PEER_RUNS-1}
case $STEPS in '' | *[!0-9]*) STEPS=0 ;; esac
[ "$STEPS" -ge 4 ] || { echo "gpt2.sh: STEPS must be a whole number >= 4 (the first 3 steps are warm-up), e.g. STEPS=13" >&2; exit 2; }
case $PEER_RUNS in '' | *[!0-9]*) PEER_RUNS=0 ;; esac
PEER_RUNS=$((10#$PEER_RUNS))
[ "$PEER_RUNS" -ge 0 ] || { echo "gpt2.sh: PEER_RUNS must be a whole number >= 0 (0: no peer), e.g. PEER_RUNS=2" >&2; exit 2; }
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
T=1024
RUNS=${RUNS:-"d12:16:1x2:0 d12:16:1x2:1 d48:8:1x2:1 d48:8:1x2:0"}
if [ "${SKIP_BUILD:-0}" != 1 ]; then
    bench/gpu/build.sh || exit 1
fi
. "$(dirname "$0")/tokens.sh" # DATA

CEIL=$(build/tests/gpu/gpt2_ops_check --ceiling 2>&1 | sed -n 's/^ceiling_tflops //p')
echo "bf16 matmul ceiling: ${CEIL:-?} TFLOP/s"
rows=()
declare -A peers # model:b:layout:ck -> the peer's fastest "ms tok/s GiB" in this call
for run in $RUNS; do
    IFS=: read -r model b layout ck extra <<<"$run"
    extra=${extra//,/ }
    g=${layout%x*} n=${layout#*x}
    w=$((g * n))
    tag=$model-b$b-$layout-ckpt$ck${extra:+-$(echo "$extra" | tr -c 'a-zA-Z0-9\n' _)}
    # ours
    rm -f /tmp/bench-m-*.jsonl
    BMT_PLUGINS=jsonl BMT_JSONL=/tmp/bench-m-%r.jsonl timeout 400 build/bin/bmlaunch --metrics-port 0 \
        --device cuda -g $g -n $n -- build/bin/gpt2 --model $model -b $b -t $T --steps $STEPS \
        --data $DATA --ckpt $ck --lr 3e-4 --warmup 0 $extra >"$OUT/ours-$tag.log" 2>&1
    rc=$?
    ours=$(python3 - "$OUT/ours-$tag.log" $STEPS $b $T $w "${CEIL:-0}" <<'PY'
import re, statistics, sys, json, glob
log, steps, b, t, w = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
ceil = float(sys.argv[6]) * 1e12
ms, mfu, peak = [], [], 0.0
for l in open(log):
    m = re.search(r"step +(\d+)/\d+ \| .*\| ([\d.]+) ms \| .* MFU ([\d.]+)% \| mem [\d.]+ MiB \(peak ([\d.]+)\)", l)
    if m and int(m.group(1)) > 3:
        ms.append(float(m.group(2))); mfu.append(float(m.group(3))); peak = max(peak, float(m.group(4)))
wait, fps = [], []
for f in glob.glob("/tmp/bench-m-*.jsonl"):
    for l in open(f):
        j = json.loads(l)
        if j.get("type") == "step" and j.get("step", 0) > 3 and j.get("step_time_s"):
            wait.append(j.get("comm_wait_s", 0) / j["step_time_s"])
            fps.append(j.get("flops_per_s") or 0)
if not ms:
    print("- - - - - - -"); sys.exit()
s = statistics.median(ms)
mc = "%.1f" % (100 * statistics.median(fps) / ceil) if fps and ceil > 0 else "-"
held = "-"
for l in open(log):
    m = re.search(r"held from the device at most ([\d.]+) MiB", l)
    if m:
        held = "%.2f" % (float(m.group(1)) / 1024)
print("%.1f %.0f %.1f %s %.2f %s %s" % (s, b * t * w / (s / 1e3), statistics.median(mfu), mc, peak / 1024,
                                        "%.1f%%" % (100 * max(wait)) if wait else "-", held))
PY
)
    # the peer, PEER_RUNS times; its fastest run is kept (once per configuration)
    key=$model:$b:$layout:$ck
    peer=${peers[$key]:-}
    [ -n "$peer" ] && echo "  fsdp2: the runs of $key above"
    runs=$PEER_RUNS
    [ -n "$peer" ] && runs=0
    for ((pr = 1; pr <= runs; pr++)); do
        timeout 400 python3 -m torch.distributed.run --standalone --nproc_per_node $w bench/gpu/fsdp2_gpt2.py \
            --model $model -b $b -t $T --steps $STEPS --groups $g $([ "$ck" = 1 ] && echo --ckpt) \
            >"$OUT/fsdp2-$tag-$pr.log" 2>&1
        p=$(sed -n 's/.*step_ms=\([0-9.]*\) tok_s=\([0-9]*\) mem_gib=\([0-9.]*\) held_gib=\([0-9.]*\).*/\1 \2 \3 \4/p' "$OUT/fsdp2-$tag-$pr.log")
        echo "  fsdp2 run $pr: ${p:-failed}"
        if [ -n "$p" ] && { [ -z "$peer" ] || awk -v a="${p%% *}" -v b="${peer%% *}" 'BEGIN { exit !(a < b) }'; }; then
            peer=$p
        fi
    done
    peers[$key]=${peer:-}
    read -r oms otok omfu omfuc omem owait oheld <<<"$ours"
    read -r pms ptok pmem pheld <<<"${peer:-- - - -}"
    ratio=$(awk -v a="$otok" -v b="$ptok" 'BEGIN { if (a+0 > 0 && b+0 > 0) printf "%.2f", a / b; else print "-" }')
    rows+=("$(printf '%-4s b%-3s %-4s ckpt %s | ours %8s ms %9s tok/s MFU %5s%% (ceiling %5s%%) mem %6s GiB (held %6s) wait %6s | fsdp2 %8s ms %9s tok/s mem %6s GiB (held %6s) | x%s (rc %s)%s' \
        $model $b $layout $ck "$oms" "$otok" "$omfu" "$omfuc" "$omem" "$oheld" "$owait" "$pms" "$ptok" "$pmem" "$pheld" "$ratio" $rc \
        "${extra:+ [ours: $extra]}")")
    echo "${rows[-1]}"
done
echo
echo "== GPT-2 T=$T, $(nvidia-smi -L | head -1 | sed 's/ (UUID.*//'), $(nvidia-smi -L | wc -l) GPUs"
printf '%s\n' "${rows[@]}" | tee "$OUT/gpt2-table.txt"
