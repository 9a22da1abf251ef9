#!/usr/bin/env python3
"""bench/comm_fit.py — fit time = a + bytes per rank / busbw to a bench/comm table.

Reads the table bench/comm prints (`op bytes bmt_us bmt_busbw ...` rows, the
header line naming the communicator's rank count) and, for each collective,
fits a (us) and busbw (GB/s) by least squares on relative error over the sizes
from --min (default 4 MiB) up: there NCCL runs the Simple protocol and a line is
a fair model (worst residual printed). Bytes per rank is what nccl-tests' busbw
counts: (n-1)/n of the buffer for all-gather and reduce-scatter, 2(n-1)/n for
all-reduce.

What a call costs beyond NCCL's own tuning model (src/graph/tuning.cc, for a
ring of n ranks on one node) is printed for the two regimes:
  call_simple_us  the mean intercept less the Simple ring's latency
                  (baseLat 8.4 us + steps x hwLat NVLink 3.4 us);
  call_ll_us      the mean time of the sizes up to --small (default 64 KiB, where
                  NCCL runs LL) less the LL ring's latency (6.6 + steps x 0.6 us),
with steps = n-1 (all-reduce: 2(n-1)). The planner's defaults
(launcher/costmodel.h) are these figures to one decimal;
tests/integration/test_planner.sh refits the recorded table and compares.
Usage: bench/comm_fit.py TABLE [--min BYTES] [--small BYTES]
"""
import re
import sys

UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
NCCL_BASE_SIMPLE_RING = 8.4
NCCL_NVLINK_STEP_SIMPLE_RING = 3.4
NCCL_BASE_LL_RING = 6.6
NCCL_NVLINK_STEP_LL_RING = 0.6


def parse(path):
    ranks, rows = None, {}
    for line in open(path):
        m = re.search(r"communicator of (\d+) ranks", line)
        if m:
            ranks = int(m.group(1))
        f = line.split()
        if len(f) >= 4 and f[0] in ("all_gather", "reduce_scatter", "all_reduce") and f[2] in UNITS:
            rows.setdefault(f[0], []).append((float(f[1]) * UNITS[f[2]], float(f[3])))
    if ranks is None or not rows:
        sys.exit("%s: not a bench/comm table (no 'communicator of N ranks' line or no rows)" % path)
    return ranks, rows


def fit(points):
    """Least squares of t = a + x * s (s = 1/busbw) weighted by 1/t^2."""
    sw = sx = st = sxx = sxt = 0.0
    for x, t in points:
        w = 1.0 / (t * t)
        sw += w; sx += w * x; st += w * t; sxx += w * x * x; sxt += w * x * t
    det = sw * sxx - sx * sx
    if len(points) < 2 or det == 0:
        sys.exit("need at least two distinct sizes in the range to fit")
    a = (sxx * st - sx * sxt) / det
    s = (sw * sxt - sx * st) / det
    return a, s


def main(argv):
    args, lo, small = [], 4 << 20, 64 << 10
    it = iter(argv)
    try:
        for a in it:
            if a == "--min":
                lo = float(next(it))
            elif a == "--small":
                small = float(next(it))
            else:
                args.append(a)
    except (StopIteration, ValueError):
        sys.exit("--min and --small need a number of bytes")
    if len(args) != 1:
        sys.exit(__doc__.strip().splitlines()[-1])
    n, rows = parse(args[0])
    simple, ll = [], []
    for op in ("all_gather", "reduce_scatter", "all_reduce"):
        if op not in rows:
            continue
        steps = (2 if op == "all_reduce" else 1) * (n - 1)
        per_rank = steps / n
        pts = [(b * per_rank, t) for b, t in rows[op] if b >= lo]
        a, s = fit(pts)
        busbw = 1.0 / s / 1e3  # bytes per us -> GB/s
        worst = max(abs(a + x * s - t) / t for x, t in pts)
        simple.append(a - NCCL_BASE_SIMPLE_RING - steps * NCCL_NVLINK_STEP_SIMPLE_RING)
        ll += [t - NCCL_BASE_LL_RING - steps * NCCL_NVLINK_STEP_LL_RING
               for b, t in rows[op] if b <= small]
        print("%-15s busbw %6.1f GB/s  intercept %6.2f us  worst residual %4.1f%%  (%d sizes)"
              % (op, busbw, a, 100 * worst, len(pts)))
    if not ll:
        sys.exit("no size up to --small bytes to fit call_ll_us")
    print("call_simple_us %.1f" % (sum(simple) / len(simple)))
    print("call_ll_us %.1f" % (sum(ll) / len(ll)))


if __name__ == "__main__":
    main(sys.argv[1:])
