#!/usr/bin/python3
"""tests/progs/lines.py — output that tests how bmlaunch relays lines.

Writes, on stdout and on stderr, lines whose lengths sit on both sides of Slurm's
1024-byte I/O messages and of bmlaunch's 65536-byte line limit, a line written in
pieces with pauses between them, and lines sent by one large write (as a
block-buffered program does). Every line says its rank, stream and length and is
filled with one letter, so a cut or joined line shows. The last stdout line has
no newline. The same program under local bmlaunch and under srun must print the
same lines per rank.
"""
import os
import sys
import time

rank = os.environ.get("BMT_RANK", "?")
LENGTHS = (1, 1022, 1023, 1024, 1025, 2047, 2048, 2049, 3000, 70000)


def line(stream, n):
    head = "%s %s %d " % (rank, stream, n)
    fill = chr(ord("a") + n % 26)
    return (head + fill * n)[: max(n, len(head))] + "\n"


for fd, name in ((1, "out"), (2, "err")):
    for n in LENGTHS:
        os.write(fd, line(name, n).encode())
    # one line in pieces, with pauses: must arrive as one line
    for piece in ("pieces: Runtime", "Error", ": ", "the message"):
        os.write(fd, piece.encode())
        time.sleep(0.05)
    os.write(fd, b"\n")
    # many lines in one write of 20000 bytes, cut anywhere by block buffering
    os.write(fd, "".join(line(name + "-block", 90 + i % 50) for i in range(180)).encode())
os.write(1, ("%s out tail without newline" % rank).encode())
sys.exit(0)
