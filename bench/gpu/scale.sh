#!/bin/bash
# bench/gpu/scale.sh — on a GPU machine with G GPUs (4 or 8: issue 9; 2 works
# too), every two-level layout g x n with g n = G, through bmlaunch:
#   coll   the collective test (build/tests/progs/collcheck) with the nccl
#          backend: world, group and replica communicators;
#   comm   bench/comm on the group and on the replica communicators (where they
#          have more than one rank) next to direct NCCL calls, 1 MiB to 1 GiB;
#   traj   the GPT-2 trainer (MODEL, default d12) for TRAJ_STEPS steps on the
#          shipped corpus with one seed in every layout: each layout's loss
#          curve against the first layout's, with the HF oracle's bf16 bounds
#          (tests/gpu/gpt2_hf.py: steps 1-10 worst relative error <= 1e-2, the
#          median of the last 10 <= 2e-2). Same G, same micro-batch: the same
#          global batch in every layout (the reader slices by world rank);
#   bench  bench/gpu/gpt2.sh with "d12:16:L:0 d48:8:L:1" per layout L (ours
#          next to FSDP2, HSDP on a g x n mesh where g > 1; STEPS, PEER_RUNS
#          pass through).
# The HF oracle per layout is tests/gpu/test_gpt2.sh (its layouts follow the
# GPU count). Knobs: PHASES="coll comm traj bench" (default: all, in that
# order), LAYOUTS="1x4 2x2 4x1" (default: every g x n = G), MODEL, TRAJ_STEPS
# (default 30), SKIP_BUILD=1. Logs under $OUT; a summary is printed last.
# DEVICE=cpu GPUS=4 runs the coll, comm and traj phases on CPU ranks (shm
# backend; MODEL=tiny, T 64) to try the script where there is no GPU.
# A full 8-GPU pass takes longer than one device call (10 minutes): split it
# by PHASES and LAYOUTS. carry: .device-deps.
set -u
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
DEVICE=${DEVICE:-cuda}
case $DEVICE in
cuda) G=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU') ;;
cpu) G=${GPUS:-4} ;;
*) echo "scale.sh: DEVICE must be cuda or cpu, not '$DEVICE'" >&2; exit 2 ;;
esac
PHASES=${PHASES:-coll comm traj bench}
MODEL=${MODEL:-$([ "$DEVICE" = cpu ] && echo tiny || echo d12)}
TRAJ_STEPS=${TRAJ_STEPS:-30}
die() { echo "scale.sh: $*" >&2; exit 2; }
has() { case " $PHASES " in *" $1 "*) return 0 ;; esac; return 1; }
[ "$G" -ge 1 ] || die "no GPU found (nvidia-smi -L)"
if [ -z "${LAYOUTS:-}" ]; then
    LAYOUTS=
    for ((g = 1; g <= G; g++)); do [ $((G % g)) -eq 0 ] && LAYOUTS+="${g}x$((G / g)) "; done
fi
for L in $LAYOUTS; do
    case $L in [1-9]*x[1-9]*) ;; *) die "layout '$L' is not GxN (e.g. 2x2)" ;; esac
    g=${L%x*} n=${L#*x}
    case "$g$n" in *[!0-9]*) die "layout '$L' is not GxN (e.g. 2x2)" ;; esac
    [ $((g * n)) -le "$G" ] || die "layout $L needs $((g * n)) GPUs; this machine has $G"
done
for p in $PHASES; do
    case $p in coll | comm | traj | bench) ;; *) die "phase '$p': choose from coll comm traj bench" ;; esac
done
case $MODEL in d12 | d48 | tiny) ;; *) die "MODEL must be d12, d48 or tiny, not '$MODEL'" ;; esac
[ "$DEVICE" = cuda ] || ! has bench || die "the bench phase needs DEVICE=cuda"
case $TRAJ_STEPS in '' | *[!0-9]*) die "TRAJ_STEPS must be a whole number >= 10" ;; esac
[ "$TRAJ_STEPS" -ge 10 ] || die "TRAJ_STEPS must be a whole number >= 10"
if [ "${SKIP_BUILD:-0}" != 1 ] && [ "$DEVICE" = cuda ]; then
    bench/gpu/build.sh || exit 1
fi
B=build/bin/bmlaunch
summary=()

if has coll; then
    for L in $LAYOUTS; do
        g=${L%x*} n=${L#*x}
        timeout 300 $B --metrics-port 0 --device $DEVICE -g $g -n $n --timeout 120 -- \
            build/tests/progs/collcheck >"$OUT/collcheck-$L.log" 2>&1
        rc=$?
        summary+=("coll  $L: rc $rc, $(grep -c 'checks passed' "$OUT/collcheck-$L.log")/$((g * n)) ranks passed")
    done
fi

if has comm; then
    for L in $LAYOUTS; do
        g=${L%x*} n=${L#*x}
        for c in group replica; do
            size=$n
            [ $c = replica ] && size=$g
            [ "$size" -gt 1 ] || continue
            timeout 300 $B --metrics-port 0 --device $DEVICE -g $g -n $n -- build/bench/comm --comm $c \
                --min $((1 << 20)) --max $([ "$DEVICE" = cpu ] && echo $((1 << 22)) || echo $((1 << 30))) \
                --dtype $([ "$DEVICE" = cpu ] && echo f32 || echo bf16) --csv "$OUT/comm-$L-$c.csv" \
                >"$OUT/comm-$L-$c.log" 2>&1
            summary+=("comm  $L $c ($size ranks): rc $?, $OUT/comm-$L-$c.log")
        done
    done
fi

if has traj; then
    T=1024 b=4
    [ "$MODEL" = d48 ] && b=2
    [ "$MODEL" = tiny ] && T=64 b=2
    build/bin/gpt2 --prepare examples/gpt2/data/corpus.txt --out /tmp/scale-corpus >/dev/null ||
        die "gpt2 --prepare failed"
    first=
    for L in $LAYOUTS; do
        g=${L%x*} n=${L#*x}
        timeout 400 $B --metrics-port 0 --device $DEVICE -g $g -n $n -- build/bin/gpt2 --model $MODEL \
            -b $b -t $T --steps $TRAJ_STEPS --data /tmp/scale-corpus_train.bin --lr 6e-4 --warmup 0 \
            --seed 1337 >"$OUT/traj-$MODEL-$L.log" 2>&1
        rc=$?
        sed -n 's/^0: step *\([0-9]*\)\/[0-9]* | loss \([0-9.]*\).*/\1 \2/p' "$OUT/traj-$MODEL-$L.log" \
            >"$OUT/traj-$MODEL-$L.txt"
        if [ -z "$first" ]; then
            first=$L
            summary+=("traj  $MODEL $L: rc $rc, the reference; loss $(head -1 "$OUT/traj-$MODEL-$L.txt" | cut -d' ' -f2) -> $(tail -1 "$OUT/traj-$MODEL-$L.txt" | cut -d' ' -f2)")
            continue
        fi
        verdict=$(python3 - "$OUT/traj-$MODEL-$first.txt" "$OUT/traj-$MODEL-$L.txt" $TRAJ_STEPS <<'PY'
import sys, statistics
def curve(f):
    return {int(s): float(l) for s, l in (x.split() for x in open(f) if x.strip())}
a, b, n = curve(sys.argv[1]), curve(sys.argv[2]), int(sys.argv[3])
if len(a) != n or len(b) != n:
    print("FAIL: %d and %d of %d steps reported" % (len(a), len(b), n)); sys.exit()
e = [abs(b[s] - a[s]) / abs(a[s]) for s in range(1, n + 1)]
w10, m10 = max(e[:10]), statistics.median(e[-10:])
ok = w10 <= 1e-2 and m10 <= 2e-2
print("%s: steps 1-10 worst %.2e (bound 1e-2), median of the last 10 %.2e (bound 2e-2)"
      % ("ok" if ok else "FAIL", w10, m10))
PY
)
        summary+=("traj  $MODEL $L against $first: rc $rc, $verdict")
    done
fi

if has bench; then
    runs=
    for L in $LAYOUTS; do runs+="d12:16:$L:0 d48:8:$L:1 "; done
    OUT="$OUT" SKIP_BUILD=1 RUNS="$runs" bench/gpu/gpt2.sh >"$OUT/bench.log" 2>&1
    summary+=("bench: rc $?, table in $OUT/gpt2-table.txt")
fi

echo
echo "== scale.sh: $G GPUs, layouts: $LAYOUTS"
printf '%s\n' "${summary[@]}"
if has comm; then
    # the rows at 16 MiB and 1 GiB of every communicator measured
    for f in "$OUT"/comm-*.log; do
        [ -f "$f" ] || continue
        echo "-- $(basename "$f" .log)"
        grep -E '^0: (all_gather|reduce_scatter|all_reduce) +(16 MiB|1 GiB) ' "$f" || tail -4 "$f"
    done
fi
[ -f "$OUT/gpt2-table.txt" ] && cat "$OUT/gpt2-table.txt"
exit 0
