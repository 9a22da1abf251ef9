#!/usr/bin/env python3
"""bench/gpu/step_stats.py LOG: a trainer's run in one line, "MS LOSS PEAK":
the median step time (ms) over steps 4 and later, the last step's loss and the
largest "mem ... MiB (peak P)" on a step line, in GiB; "- - -" when the log has
no step after the warm-up (the run failed: the log says why). Used by
trainer_ab.sh and master_ab.sh."""
import re
import statistics
import sys

ms, loss, peak = [], "-", 0.0
for line in open(sys.argv[1], errors="replace"):
    m = re.search(r"step +(\d+)/\d+ \| loss ([\d.]+) .*\| ([\d.]+) ms \|", line)
    if m:
        loss = m.group(2)
        if int(m.group(1)) > 3:
            ms.append(float(m.group(3)))
    p = re.search(r"mem [\d.]+ MiB \(peak ([\d.]+)\)", line)
    if p:
        peak = max(peak, float(p.group(1)))
print("%.2f %s %.2f" % (statistics.median(ms), loss, peak / 1024) if ms else "- - -")
