#!/bin/bash
# bench/planner_check.sh — the planner's predictions next to the GPT-2 runs measured
# on H200 (bench/NOTES.md), one row per run: step time, exposed communication and
# peak memory, predicted by `bmlaunch --plan --model ... --json` with its defaults
# (MFU 0.45, NVLink fitted to bench/comm) and measured by bench/gpu/gpt2.sh.
# Measured figures (ms, % of the step, GiB) and where they come from:
#   1x1: results/2026-12-01-gpt2-H200-session9.txt (d48 ckpt 0/1, d12 ckpt 0/1)
#   1x2, 2x1: results/2026-12-01-gpt2-2xH200-session8.txt (first call of each)
#   fp8: results/2026-12-04-fp8-H200-session18.txt, the last call (FP8's mean of
#     three; its bf16 ran at 180.1 ms there, 172.2 in session 9: compare ratios
#     within a call, and --fp8-speedup is fitted to that call's 180.1 / 142.6)
# "exposed" is comm_wait_s / step of the worst rank, what the trainer reports.
# Usage: bench/planner_check.sh [BMLAUNCH]   (default build/bin/bmlaunch)
set -euo pipefail
BMLAUNCH=${1:-build/bin/bmlaunch}
[ -x "$BMLAUNCH" ] || { echo "planner_check: $BMLAUNCH is not built (make)" >&2; exit 2; }
# model batch groups gpus-per-group ckpt fp8 | measured step ms, exposed %, peak GiB
RUNS="d48 8 1 1 0 0 172.2 0.3 37.62
d48 8 1 1 1 0 212.7 0.2 23.87
d12 16 1 1 0 0 31.5 0.6 7.80
d12 16 1 1 1 0 40.7 0.4 2.61
d48 8 1 2 1 0 218.3 0.7 12.49
d48 8 1 2 0 0 188.1 0.9 29.06
d12 16 1 2 0 0 33.7 1.9 7.18
d12 16 1 2 1 0 43.2 2.1 1.98
d48 8 2 1 1 0 225.8 0.3 23.87
d12 16 2 1 0 0 34.3 0.8 7.80
d48 8 1 1 0 1 142.6 0.3 36.17
d48 8 1 1 1 1 173.3 0.2 24.05"
printf '| run | step ms: predicted / measured | miss | exposed %%: predicted / measured | peak GiB: predicted / measured | miss |\n'
printf '|---|---|---|---|---|---|\n'
while read -r model b g n ckpt fp8 ms wait gib; do
    "$BMLAUNCH" --plan --json --model "$model" --micro-batch "$b" -g "$g" -n "$n" \
        --gpus-per-node $((g * n)) --ckpt "$ckpt" --fp8 "$fp8" |
        /usr/bin/python3 -c '
import json, sys
model, b, g, n, ckpt, fp8, ms, wait, gib = sys.argv[1:]
p = json.load(sys.stdin)["cost_model"]
y = [l for l in p["layouts"] if l["yours"]][0]
step = y["step_s"] * 1e3
exp = 100 * y["exposed_s"] / y["step_s"]
peak = y["memory_bytes"]["peak"] / 2**30
print("| %s b%s %sx%s ckpt %s%s | %.1f / %s | %+.1f%% | %.1f / %s | %.2f / %s | %+.1f%% |" % (
    model, b, g, n, ckpt, " fp8" if fp8 == "1" else "", step, ms, 100 * (step / float(ms) - 1), exp, wait, peak, gib,
    100 * (peak / float(gib) - 1)))
' "$model" "$b" "$g" "$n" "$ckpt" "$fp8" "$ms" "$wait" "$gib"
done <<<"$RUNS"
