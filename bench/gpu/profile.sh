#!/bin/bash
# bench/gpu/profile.sh — where a GPT-2 step's GPU time goes, by kernel: runs
# the trainer on one GPU (1x1) under Nsight Systems and prints the kernels'
# summed time per step, largest first, with their share of the GPU time.
#
#   PROF="d48:8:1" STEPS=5 bench/gpu/profile.sh      (model:micro-batch:ckpt)
#
# Needs a build (bench/gpu/build.sh) and nsys on PATH or in /usr/local/cuda;
# without nsys it says so and exits 3. The report goes to $OUT/profile-*.txt.
set -u
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
STEPS=${STEPS:-5}
IFS=: read -r model b ck <<<"${PROF:-d48:8:1}"
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
if [ -z "$NSYS" ]; then
    echo "profile.sh: no nsys on this machine (PATH, /usr/local/cuda/bin, /opt/nvidia)" >&2
    exit 3
fi
DATA=/tmp/bench-tokens.bin
[ -f $DATA ] || python3 -c "
import numpy as np
n = 1 << 23
h = np.zeros(256, np.int32); h[0], h[1], h[2] = 20240520, 1, n
t = np.random.default_rng(0).integers(0, 50257, n).astype(np.uint16)
open('$DATA', 'wb').write(h.tobytes() + t.tobytes())"
tag=$model-b$b-ckpt$ck
rep=/tmp/profile-$tag
rm -f $rep.nsys-rep $rep.sqlite
"$NSYS" profile -t cuda --trace-fork-before-exec=true -f true -o $rep \
    build/bin/bmlaunch --metrics-port 0 --device cuda -g 1 -n 1 -- build/bin/gpt2 --model "$model" \
    -b "$b" -t 1024 --steps "$STEPS" --data $DATA --ckpt "$ck" --lr 3e-4 --warmup 0 \
    >"$OUT/profile-$tag.run.log" 2>&1 || { tail -5 "$OUT/profile-$tag.run.log"; exit 1; }
"$NSYS" stats -q --report cuda_gpu_kern_sum --format csv -o /tmp/prof-$tag $rep.nsys-rep >/dev/null 2>&1
csv=$(ls /tmp/prof-$tag*cuda_gpu_kern_sum*.csv 2>/dev/null | head -1)
[ -n "$csv" ] || { echo "profile.sh: nsys stats wrote no kernel summary" >&2; exit 1; }
python3 - "$csv" "$STEPS" <<'PY' | tee "$OUT/profile-$tag.txt"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
steps = int(sys.argv[2])
tot = sum(float(r["Total Time (ns)"]) for r in rows)
print("GPU kernel time %.1f ms per step (%d steps, warm-up included)" % (tot / 1e6 / steps, steps))
for r in rows[:30]:
    t = float(r["Total Time (ns)"])
    print("%7.2f ms/step %5.1f%% %7d calls  %s" % (t / 1e6 / steps, 100 * t / tot, int(r["Instances"]),
                                                 r["Name"][:110]))
PY
