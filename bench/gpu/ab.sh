#!/bin/bash
# bench/gpu/ab.sh — the GPT-2 kernels' timings for several versions of
# nn/ops_cuda.cu, measured in the same device call, side by side.
#
#   AB="old=build-ab/old.cu v2=build-ab/v2.cu" bench/gpu/ab.sh
#
# The working tree's ops_cuda.cu is always the first column ("tree"); each
# NAME=FILE in AB is copied over it in turn, gpt2_ops_check is rebuilt
# (bench/gpu/build.sh, so .device-deps must be carried) and its --bench runs
# ROUNDS times (default 2; the figures are each run's median of 20). The rounds
# go tree, then every version, then again, so drift on the machine shows as a
# difference between rounds of the same column. The tree's file is put back
# at the end, also on failure. Logs: $OUT/ab_NAME_ROUND.log. Keep the versions
# in an ignored folder (build-ab/) and name it in carry. BENCH_ARGS="0 d48"
# times d48's shapes instead of d12's (gpt2_ops_check --bench N SHAPES). Every
# run checks its version first (the ops' "ok" lines are in its log).
set -u
OUT=${OUT:-$PWD/gpu-out}
ROUNDS=${ROUNDS:-2}
SRC=nn/ops_cuda.cu
mkdir -p "$OUT"
case "$ROUNDS" in '' | *[!0-9]* | 0) echo "ab.sh: ROUNDS must be a count of at least 1, not '$ROUNDS'" >&2; exit 2 ;; esac
names=(tree) files=("")
for kv in ${AB:-}; do
    n=${kv%%=*} f=${kv#*=}
    if [ "$n" = "$kv" ] || [ -z "$n" ] || [ ! -f "$f" ]; then
        echo "ab.sh: '$kv' is not NAME=FILE with an existing FILE (AB='old=build-ab/old.cu ...')" >&2
        exit 2
    fi
    case "$n" in *[!A-Za-z0-9_.-]*) echo "ab.sh: name '$n': letters, digits, '.', '_', '-' only" >&2; exit 2 ;; esac
    names+=("$n") files+=("$f")
done
[ ${#names[@]} -gt 1 ] || { echo "ab.sh: AB names no version to compare with the tree's" >&2; exit 2; }
keep=$(mktemp)
cp "$SRC" "$keep"
restore() { cp "$keep" "$SRC"; rm -f "$keep"; }
trap restore EXIT
for ((r = 1; r <= ROUNDS; r++)); do
    for i in "${!names[@]}"; do
        if [ -z "${files[$i]}" ]; then cp "$keep" "$SRC"; else cp "${files[$i]}" "$SRC"; fi
        bench/gpu/build.sh build/tests/gpu/gpt2_ops_check || { echo "ab.sh: ${names[$i]} does not build"; exit 1; }
        # shellcheck disable=SC2086 # BENCH_ARGS is words on purpose
        timeout 120 build/tests/gpu/gpt2_ops_check --bench ${BENCH_ARGS:-} >"$OUT/ab_${names[$i]}_$r.log" 2>&1 ||
            { echo "ab.sh: ${names[$i]} --bench failed: $OUT/ab_${names[$i]}_$r.log"; exit 1; }
    done
done
# one row per timed operation: "#   NAME  X ms ..." -> NAME and the first figure
{
    printf '%-30s' "op (ms)"
    for ((r = 1; r <= ROUNDS; r++)); do for n in "${names[@]}"; do printf ' %9s' "$n/$r"; done; done
    echo
    grep '^#   ' "$OUT/ab_tree_1.log" | sed 's/^#   //; s/ *[0-9.]* ms.*//' | while read -r op; do
        printf '%-30s' "$op"
        for ((r = 1; r <= ROUNDS; r++)); do
            for n in "${names[@]}"; do
                v=$(grep -F "#   $op " "$OUT/ab_${n}_$r.log" | head -1 | sed 's/^#   //' |
                    awk -v op="$op" '{ s = substr($0, length(op) + 1); split(s, a, " "); print a[1] }')
                printf ' %9s' "${v:--}"
            done
        done
        echo
    done
}
