#!/bin/bash
# bench/gpu/tree_ab.sh — the GPT-2 trainer's step time and memory for the working
# tree and another commit's tree, measured in the same device call, alternating.
#
#   git archive --prefix=old/ COMMIT | tar -x -C build-ab      (on the Debian machine)
#   OLD=build-ab/old RUNS="d48:8:1x1:1 d12:16:1x1:0" ROUNDS=2 bench/gpu/tree_ab.sh
#
# carry: .device-deps and build-ab. Both trees are built (bench/gpu/build.sh, in
# parallel); each RUN (model:micro-batch:layout:checkpointing, as in
# bench/gpu/gpt2.sh) then runs tree, old, tree, old ... (ROUNDS each, default 2)
# for STEPS steps (default 13; the median of the steps after the third is kept),
# so drift on the machine shows as a difference between rounds of one tree.
# Prints a table last: per run, each round's median step ms for both trees, the
# ratio of the medians (old / tree: above 1 means the tree is faster), and each
# tree's peak memory of all kinds at once (GiB) and gathered-buffer peak (MiB).
# Logs: $OUT/ab-<tree|old>-<run>-<round>.log.
set -u
OUT=${OUT:-$PWD/gpu-out}
ROUNDS=${ROUNDS:-2} STEPS=${STEPS:-13}
RUNS=${RUNS:-"d48:8:1x1:1 d12:16:1x1:0"}
OLD=${OLD:-}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
[ -n "$OLD" ] && [ -f "$OLD/Makefile" ] || {
    echo "tree_ab.sh: OLD must name a source tree (git archive --prefix=old/ COMMIT | tar -x -C build-ab)" >&2
    exit 2
}
case "$ROUNDS$STEPS" in *[!0-9]*) echo "tree_ab.sh: ROUNDS and STEPS are counts" >&2; exit 2 ;; esac
[ "$STEPS" -ge 5 ] || { echo "tree_ab.sh: STEPS must be at least 5" >&2; exit 2; }
ln -sfn "$PWD/.device-deps" "$OLD/.device-deps"
T0=$(date +%s)
(cd "$OLD" && OUT="$OUT/old-build" bash "$OLDPWD/bench/gpu/build.sh") &
old_pid=$!
OUT="$OUT/tree-build" bench/gpu/build.sh || exit 1
wait $old_pid || { echo "tree_ab.sh: the old tree did not build"; exit 1; }
echo "both built: t=$(($(date +%s) - T0)) s"
. "$(dirname "$0")/tokens.sh" # DATA

# one TREE_DIR TAG RUN ROUND: prints "ms peak_gib gathered_mib"
one() {
    local dir=$1 tag=$2 run=$3 r=$4 model b layout ck extra g n log
    IFS=: read -r model b layout ck extra <<<"$run"
    extra=${extra//,/ }
    g=${layout%x*} n=${layout#*x}
    log=$OUT/ab-$tag-$model-b$b-$layout-ckpt$ck-$r.log
    (cd "$dir" && timeout 300 build/bin/bmlaunch --metrics-port 0 --device cuda -g $g -n $n -- \
        build/bin/gpt2 --model $model -b $b -t 1024 --steps $STEPS --data $DATA --ckpt $ck \
        --lr 3e-4 $extra) >"$log" 2>&1
    python3 - "$log" <<'PY'
import re, statistics, sys
ms, peak, gathered = [], 0.0, "-"
for l in open(sys.argv[1]):
    m = re.search(r"step +(\d+)/\d+ \| .*\| ([\d.]+) ms \| .* mem [\d.]+ MiB \(peak ([\d.]+)\)", l)
    if m and int(m.group(1)) > 3:
        ms.append(float(m.group(2))); peak = max(peak, float(m.group(3)))
    m = re.search(r"gathered ([\d.]+)", l)
    if m and "peak memory by kind" in l:
        gathered = m.group(1)
print("%.1f %.2f %s" % (statistics.median(ms), peak / 1024, gathered) if ms else "- - -")
PY
}

rows=()
for run in $RUNS; do
    t=() o=()
    for ((r = 1; r <= ROUNDS; r++)); do
        t+=("$(one . tree "$run" $r)")
        o+=("$(one "$OLD" old "$run" $r)")
        echo "$run round $r: tree ${t[-1]} | old ${o[-1]} (t=$(($(date +%s) - T0)) s)"
    done
    row=$(python3 - "$run" "${t[@]}" -- "${o[@]}" <<'PY'
import statistics, sys
run, rest = sys.argv[1], sys.argv[2:]
i = rest.index("--")
t, o = [x.split() for x in rest[:i]], [x.split() for x in rest[i + 1:]]
def ms(v): return [float(x[0]) for x in v if x[0] != "-"]
tm, om = ms(t), ms(o)
ratio = "%.3f" % (statistics.median(om) / statistics.median(tm)) if tm and om else "-"
print("%-16s | tree %s ms, peak %s GiB, gathered %s MiB | old %s ms, peak %s GiB, gathered %s MiB | old/tree %s" % (
    run, " / ".join(x[0] for x in t), t[0][1], t[0][2], " / ".join(x[0] for x in o), o[0][1], o[0][2], ratio))
PY
)
    rows+=("$row")
done
echo
echo "== tree vs $OLD, T=1024, $(nvidia-smi -L | head -1 | sed 's/ (UUID.*//'), rounds alternate tree, old"
printf '%s\n' "${rows[@]}" | tee "$OUT/tree-ab.txt"
