#!/usr/bin/env python3
"""bench/gpu/timeline.py — what one training step's GPU time is made of, from
the kernel timeline bench/gpu/trace.c writes (CUPTI: real concurrency, real
gaps; bench/gpu/profile.sh's Nsight Compute figures are serialized).

    timeline.py TRACE.tsv [STEP]

A step runs from one launch of the first-block kernel (encoder_fwd, or the
kernel named by MARK=) to the next; STEP picks which (default: the second
last complete one). Prints, for that step:
  - its length, the compute stream's busy time and idle time (gaps), and how
    much of the idle time the host caused (it enqueued the next kernel after
    the previous one had ended; memsets and copies carry no such time);
  - every stream's busy time and how much of it ran beside the compute stream;
  - the compute stream's kernels by name (count, time), largest first;
  - the largest gaps with the kernels around them and what other streams ran.
Environment: MARK (the step's first kernel, default encoder_fwd), TOP (kernel
rows, default 30), GAPS (gap rows, default 15).
"""
import collections
import os
import sys


def load(path):
    rows = []
    try:
        f = open(path)
    except OSError as e:
        sys.exit("timeline.py: %s" % e)
    with f:
        for n, line in enumerate(f, 1):
            p = line.rstrip("\n").split("\t")
            try:
                rows.append({"kind": p[0], "start": int(p[1]), "end": int(p[2]),
                             "queued": int(p[3]), "stream": int(p[4]), "grid": p[5],
                             "name": p[6]})
            except (IndexError, ValueError):
                sys.exit("timeline.py: %s line %d is not a bench/gpu/trace.c record "
                         "(KIND START END QUEUED STREAM GRID NAME, tab-separated)" % (path, n))
    rows.sort(key=lambda r: r["start"])
    return rows


def short(name, n=70):
    return name if len(name) <= n else name[: n - 3] + "..."


def union(iv):
    """Total length of a union of intervals and the merged list."""
    iv = sorted(iv)
    out = []
    for s, e in iv:
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return sum(e - s for s, e in out), out


def overlap(a, b):
    """Length of the intersection of two merged interval lists."""
    i = j = 0
    tot = 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            tot += e - s
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return tot


def env_count(name, default):
    v = os.environ.get(name, str(default))
    if not v.isdigit():
        sys.exit("timeline.py: %s must be a whole number, not '%s'" % (name, v))
    return int(v)


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: timeline.py TRACE.tsv [STEP]")
    rows = load(sys.argv[1])
    mark = os.environ.get("MARK", "encoder_fwd")
    starts = [r for r in rows if mark in r["name"]]
    if len(starts) < 2:
        sys.exit("timeline.py: want two launches of %s in %s, found %d" % (mark, sys.argv[1], len(starts)))
    arg = sys.argv[2] if len(sys.argv) > 2 else str(len(starts) - 2)
    k = int(arg) if arg.isdigit() else -1
    if not 0 <= k < len(starts) - 1:
        sys.exit("timeline.py: STEP must be 0..%d" % (len(starts) - 2))
    t0, t1 = starts[k]["start"], starts[k + 1]["start"]
    cs = starts[k]["stream"]
    step = [r for r in rows if r["end"] > t0 and r["start"] < t1]
    ms = lambda ns: ns / 1e6
    L = t1 - t0
    comp = [r for r in step if r["stream"] == cs]
    other = [r for r in step if r["stream"] != cs]
    busy, merged = union([(max(r["start"], t0), min(r["end"], t1)) for r in comp])
    # gaps on the compute stream, each with whether the host was late
    gaps = []
    for a, b in zip(comp, comp[1:]):
        g = b["start"] - a["end"]
        if g > 0:
            host = b["queued"] > a["end"]  # the host enqueued it after a had ended
            gaps.append((g, a, b, host))
    idle = L - busy
    host_idle = sum(min(g, b["queued"] - a["end"]) for g, a, b, h in gaps if h)
    print("step %d: %.2f ms; compute stream %d: busy %.2f ms (%.1f%%), idle %.2f ms in %d gaps"
          % (k, ms(L), cs, ms(busy), 100.0 * busy / L, ms(idle), len(gaps)))
    print("  of the idle time, %.2f ms with the next kernel not yet enqueued by the host" % ms(host_idle))
    _, others = union([(r["start"], r["end"]) for r in other])
    beside_gaps = overlap([[a["end"], b["start"]] for g, a, b, h in gaps], others)
    print("  of the idle time, %.2f ms with other streams' work running (the compute stream waits"
          " for SMs, or for an event on that work)" % ms(beside_gaps))
    hist = collections.Counter()
    for g, *_ in gaps:
        hist["<2us" if g < 2000 else "2-5us" if g < 5000 else "5-20us" if g < 20000 else
             "20-100us" if g < 100000 else ">=100us"] += g
    print("  gaps by length: " + ", ".join("%s %.2f ms" % (b, ms(hist[b]))
                                           for b in ("<2us", "2-5us", "5-20us", "20-100us", ">=100us")))
    print("streams:")
    by_stream = collections.defaultdict(list)
    for r in step:
        by_stream[r["stream"]].append((max(r["start"], t0), min(r["end"], t1)))
    for s, iv in sorted(by_stream.items()):
        b, m = union(iv)
        print("  stream %3d: busy %8.2f ms, %8.2f ms of it beside the compute stream's kernels, %d records"
              % (s, ms(b), ms(overlap(m, merged)) if s != cs else 0.0, len(iv)))
    print("compute stream kernels by name (real durations, with whatever ran beside them):")
    tot = collections.defaultdict(lambda: [0, 0])
    for r in comp:
        t = tot[r["name"]]
        t[0] += r["end"] - r["start"]
        t[1] += 1
    for name, (t, n) in sorted(tot.items(), key=lambda x: -x[1][0])[:env_count("TOP", 30)]:
        print("  %8.3f ms %5.1f%% %5d x  %s" % (ms(t), 100.0 * t / L, n, short(name)))
    print("largest gaps on the compute stream:")
    for g, a, b, host in sorted(gaps, key=lambda x: -x[0])[:env_count("GAPS", 15)]:
        beside = [r for r in other if r["end"] > a["end"] and r["start"] < b["start"]]
        names = collections.Counter(short(r["name"], 30) for r in beside)
        print("  %7.1f us after %s, before %s%s; beside: %s"
              % (g / 1e3, short(a["name"], 40), short(b["name"], 40), " (host late)" if host else "",
                 ", ".join("%d x %s" % (n, x) for x, n in names.most_common(3)) or "nothing"))


if __name__ == "__main__":
    main()
