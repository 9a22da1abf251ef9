#!/bin/bash
# bench/gpu/profile.sh — where a GPT-2 step's GPU time goes, by kernel, with
# Nsight Compute (the GPU machine has ncu, not nsys): the trainer runs on one
# GPU (1x1) for 2 steps with every kernel's duration recorded
# (gpu__time_duration; ncu serializes the kernels, so there is no overlap in
# these figures), and the second step's kernels (from the second launch of
# the encoder on) are summed by name, largest first.
#
#   PROF="d48:8:1:4" bench/gpu/profile.sh     (model:micro-batch:ckpt:layers)
#   PROF_ARGS="--fp8 1"                        more trainer options
#
# Fewer layers than the model's (4 here) keep the run short: the layers are
# alike, so one layer's figures times the real count give the whole. Needs a
# build (bench/gpu/build.sh). Reports: $OUT/profile-*.txt (and ncu's csv).
set -u
OUT=${OUT:-$PWD/gpu-out}
export NCCL_NVLS_ENABLE=0
IFS=: read -r model b ck layers <<<"${PROF:-d48:8:1:4}"
case "$model:$b:$ck:$layers" in
    ?*:[1-9]*:[01]:[1-9]*) ;;
    *) echo "profile.sh: PROF=MODEL:MICRO-BATCH:CKPT:LAYERS, e.g. PROF=d48:8:1:4 (got '${PROF:-}')" >&2; exit 2 ;;
esac
case "$b$layers" in *[!0-9]*) echo "profile.sh: the micro-batch and layers of PROF are whole numbers, e.g. PROF=d48:8:1:4" >&2; exit 2 ;; esac
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
if [ -z "$NCU" ]; then
    echo "profile.sh: no ncu on this machine (PATH, /usr/local/cuda/bin)" >&2
    exit 3
fi
mkdir -p "$OUT"
. "$(dirname "$0")/tokens.sh" # DATA
tag=$model-L$layers-b$b-ckpt$ck$(echo "${PROF_ARGS:-}" | tr -c 'a-zA-Z0-9\n' _)
# The trainer runs as a job of one without bmlaunch (a PMIx singleton,
# BMT_DEVICE=cuda): under ncu, bmlaunch did not end after its rank had (seen
# on the GPU machine, seventh and eighth sessions: the trainer's 2 steps done
# in ~60 s, then ncu waited to its limit and wrote no rows, since ncu prints
# the csv only once every process it follows has ended).
run() { # the trainer, 2 steps, under "$@"
    "$@" env BMT_DEVICE=cuda build/bin/gpt2 \
        --model "$model" --layers "$layers" -b "$b" -t 1024 --steps 2 --data $DATA --ckpt "$ck" \
        --lr 3e-4 --warmup 0 ${PROF_ARGS:-}
}
# A time limit all the same, and the csv is read either way: it is whole once
# both steps are in it.
# --clock-control none: the GPU's own clocks, as in a real step (ncu's default
# locks them to base clocks, which on the GPU machine ran the job past the limit).
run timeout "${PROF_TIMEOUT:-240}" "$NCU" --target-processes all --clock-control none \
    --metrics gpu__time_duration.sum --csv --print-units base >"$OUT/profile-$tag.csv" 2>"$OUT/profile-$tag.err"
rc=$?
[ $rc -eq 0 ] || echo "profile.sh: ncu exited $rc (124: the time limit); reading what it wrote" >&2
python3 - "$OUT/profile-$tag.csv" <<'PY' | tee "$OUT/profile-$tag.txt"
import csv, io, sys, collections
text = open(sys.argv[1]).read()
start = text.find('"ID"')
rows = [r for r in csv.DictReader(io.StringIO(text[start:])) if r.get("Metric Name") == "gpu__time_duration.sum"]
# the last step: from the last launch of the encoder (block 0's forward) on
starts = [i for i, r in enumerate(rows) if "encoder_fwd" in r["Kernel Name"]]
if len(starts) < 2:
    sys.exit("profile.sh: want 2 steps' encoder_fwd launches, found %d" % len(starts))
half = starts[-1]
by = collections.defaultdict(lambda: [0.0, 0])
for r in rows[half:]:
    name = r["Kernel Name"]
    by[name][0] += float(r["Metric Value"].replace(",", "")) / 1e6  # ncu writes 79,008
    by[name][1] += 1
tot = sum(v[0] for v in by.values())
print("the second step: %d kernels, %.2f ms of GPU time (serialized)" % (len(rows) - half, tot))
for name, (ms, n) in sorted(by.items(), key=lambda kv: -kv[1][0])[:40]:
    print("%8.3f ms %5.1f%% %5d x  %s" % (ms, 100 * ms / tot, n, name[:120]))
PY
