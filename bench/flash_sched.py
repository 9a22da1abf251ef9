#!/usr/bin/env python3
"""bench/flash_sched.py -- a list-scheduling model of the flash attention
kernels' grids (bench/NOTES.md, twenty-first session).

Blocks go onto S slots (blocks the device holds at once) in the order the
device dispatches them, their linear index; each block runs its steps (one
64-row tile of the other side each, all of equal length) and frees its slot.
A dK/dV block of key tile j walks G (Q - j) query tiles (G query heads per kv
head); a forward or dQ block of 128 query rows i walks 2 i + 2 key tiles.
Prints the makespan in steps of tile-major grids (each column's blocks in
turn, longest first) and of column-major ones (every column's longest block
first: what nn/ops_cuda.cu launches since then), next to the work per slot
(the bound no order beats). Needs nothing but python3.
"""
import heapq


def makespan(lengths, slots):
    free = [0.0] * slots
    end = 0.0
    for n in lengths:
        t = heapq.heappop(free) + n
        heapq.heappush(free, t)
        end = max(end, t)
    return end


def row(name, cols, blocks, slots):
    """blocks: the lengths of one column's blocks, longest first"""
    tile_major = [n for _ in range(cols) for n in blocks]
    col_major = [n for n in blocks for _ in range(cols)]
    work = cols * sum(blocks) / slots
    print("%-34s work/slot %5.0f  tile-major %5.0f  column-major %5.0f" %
          (name, work, makespan(tile_major, slots), makespan(col_major, slots)))


# (name, columns, tiles of 64 rows, G, slots of dK/dV, slots of fwd/dQ)
SHAPES = [
    ("Llama 3.2 1B, B 2, T 4096", 2 * 8, 64, 4, 3 * 132, 2 * 132),
    ("3B-like (hd 128), B 1, T 4096", 1 * 8, 64, 3, 2 * 132, 1 * 132),
    ("GPT-2 d48, B 8, T 1024", 8 * 25, 16, 1, 3 * 132, 2 * 132),
]
for name, kv_cols, q, g, s_kv, s_q in SHAPES:
    row(name + ": dK/dV", kv_cols, [g * (q - j) for j in range(q)], s_kv)
    row(name + ": fwd, dQ", kv_cols * g, [2 * i + 2 for i in reversed(range(q // 2))], s_q)
