#!/usr/bin/python3
"""tests/tools/ckpt_tool.py — an independent look at bmt checkpoints (numpy and
python3-xxhash, nothing of bmt), for tests/integration/test_trust.sh.

  ckpt_tool.py sums DIR
      Recompute every checksum of DIR (a checkpoint directory) with xxhash's
      XXH3-64: each file's header against train_state.json's "headers", each
      unit of every checksums-*.json against the bytes, and check that the units
      tile each file's data section exactly. Prints "sums ok: N files, M units".
  ckpt_tool.py plant DIR FILE TENSOR INDEX VALUE [--fix-sums]
      Write VALUE (nan, inf, -inf or a number) into element INDEX of TENSOR in
      DIR/FILE (F32 or BF16). --fix-sums: recompute the checksum of the unit
      that holds it, so that only the value is wrong.
  ckpt_tool.py flip DIR FILE TENSOR INDEX
      Flip the lowest bit of element INDEX of TENSOR (no checksum fixed).
  ckpt_tool.py header DIR FILE
      Change one byte of FILE's JSON header (its metadata's "pt" becomes "pu"),
      keeping it valid JSON of the same length.
  ckpt_tool.py old DIR
      Make DIR look like a checkpoint of a bmt before checksums (version 1).
  ckpt_tool.py drop DIR FILE TENSOR
      Rewrite DIR/FILE without TENSOR, with every checksum of the file made
      again (its header's in train_state.json, its units retiled), so that
      only the tensor's absence is wrong.
  ckpt_tool.py f16 DIR FILE TENSOR
      The same with TENSOR (F32) stored as F16, values kept as far as F16
      holds them.
"""
import glob
import json
import os
import struct
import sys

import numpy as np
import xxhash


def header(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])
    h.pop("__metadata__", None)
    return raw, 8 + n, h


def manifests(d):
    return sorted(glob.glob(os.path.join(d, "checksums-*.json")))


def sums(d):
    ts = json.load(open(os.path.join(d, "train_state.json")))
    ck = ts["checksums"]
    assert ck["algorithm"] == "xxh3_64", ck
    units = {}
    for m in ck["files"]:
        j = json.load(open(os.path.join(d, m)))
        assert j["format"] == "bmt-checksums" and j["algorithm"] == "xxh3_64", j
        for f, lst in j["files"].items():
            units.setdefault(f, []).extend(lst)
    nunits = 0
    for f, hh in sorted(ck["headers"].items()):
        raw, start, _ = header(os.path.join(d, f))
        got = xxhash.xxh3_64_hexdigest(raw[:start])
        assert got == hh, (f, "header", got, hh)
        at = start
        for off, ln, hx in sorted(units.get(f, [])):
            assert off == at, (f, "units do not tile", off, at)
            got = xxhash.xxh3_64_hexdigest(raw[off:off + ln])
            assert got == hx, (f, off, ln, got, hx)
            at += ln
            nunits += 1
        assert at == len(raw), (f, "units end at", at, "file size", len(raw))
    assert set(units) <= set(ck["headers"]), set(units) - set(ck["headers"])
    print("sums ok: %d files, %d units" % (len(ck["headers"]), nunits))


def element(d, f, tensor, index):
    raw, start, h = header(os.path.join(d, f))
    t = h[tensor]
    size = {"F32": 4, "BF16": 2}[t["dtype"]]
    off = start + t["data_offsets"][0] + index * size
    assert off + size <= start + t["data_offsets"][1], "index out of range"
    return off, size, t["dtype"]


def fix_unit(d, f, off):
    path = os.path.join(d, f)
    raw = open(path, "rb").read()
    for m in manifests(d):
        j = json.load(open(m))
        for u in j["files"].get(f, []):
            if u[0] <= off < u[0] + u[1]:
                u[2] = xxhash.xxh3_64_hexdigest(raw[u[0]:u[0] + u[1]])
                open(m, "w").write(json.dumps(j, sort_keys=True, separators=(",", ":")))
                return
    raise SystemExit("no unit holds byte %d of %s" % (off, f))


def plant(d, f, tensor, index, value, fix):
    off, size, dtype = element(d, f, tensor, int(index))
    v = np.array([float(value)], dtype=np.float32)
    b = v.tobytes() if dtype == "F32" else v.view(np.uint32).__rshift__(16).astype(
        np.uint16).tobytes()
    with open(os.path.join(d, f), "r+b") as fh:
        fh.seek(off)
        fh.write(b)
    if fix:
        fix_unit(d, f, off)


def flip(d, f, tensor, index):
    off, _, _ = element(d, f, tensor, int(index))
    with open(os.path.join(d, f), "r+b") as fh:
        fh.seek(off)
        b = fh.read(1)
        fh.seek(off)
        fh.write(bytes([b[0] ^ 1]))


def touch_header(d, f):
    p = os.path.join(d, f)
    raw = open(p, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    i = raw.index(b'"pt"', 8, 8 + n)
    open(p, "wb").write(raw[:i] + b'"pu"' + raw[i + 4:])


def old(d):
    p = os.path.join(d, "train_state.json")
    ts = json.load(open(p))
    ts["version"] = 1
    for k in ("checksums", "finite"):
        ts.pop(k, None)
    json.dump(ts, open(p, "w"), indent=1)
    for m in manifests(d):
        os.remove(m)


def rewrite(d, f, tensor, how):
    """DIR/FILE again, TENSOR dropped (how "drop") or made F16 ("f16"), the
    header's and the units' checksums made for the new bytes."""
    path = os.path.join(d, f)
    raw, start, h = header(path)
    meta = json.loads(raw[8:start]).get("__metadata__")
    assert tensor in h, "%s: no tensor %s" % (f, tensor)
    out, data, at = {}, [], 0
    for name, t in sorted(h.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        b = raw[start + t["data_offsets"][0]:start + t["data_offsets"][1]]
        if name == tensor and how == "drop":
            continue
        dtype = t["dtype"]
        if name == tensor:
            assert dtype == "F32", t
            b, dtype = np.frombuffer(b, dtype="<f4").astype("<f2").tobytes(), "F16"
        out[name] = {"dtype": dtype, "shape": t["shape"], "data_offsets": [at, at + len(b)]}
        data.append(b)
        at += len(b)
    if meta is not None:
        out["__metadata__"] = meta
    hj = json.dumps(out, separators=(",", ":")).encode()
    hj += b" " * (-len(hj) % 8)
    new = struct.pack("<Q", len(hj)) + hj + b"".join(data)
    open(path, "wb").write(new)
    p = os.path.join(d, "train_state.json")
    ts = json.load(open(p))
    ts["checksums"]["headers"][f] = xxhash.xxh3_64_hexdigest(new[:8 + len(hj)])
    json.dump(ts, open(p, "w"), indent=1)
    unit, done = 1 << 20, False  # the file's units may be in several ranks' manifests
    for m in manifests(d):
        j = json.load(open(m))
        if f in j["files"]:
            if done:
                del j["files"][f]
            else:
                j["files"][f] = [[o, min(unit, len(new) - o),
                                  xxhash.xxh3_64_hexdigest(new[o:o + unit])]
                                 for o in range(8 + len(hj), len(new), unit)]
                done = True
            open(m, "w").write(json.dumps(j, sort_keys=True, separators=(",", ":")))


if __name__ == "__main__":
    a = sys.argv[1:]
    if a[0] == "sums":
        sums(a[1])
    elif a[0] == "plant":
        plant(a[1], a[2], a[3], a[4], a[5], "--fix-sums" in a)
    elif a[0] == "flip":
        flip(a[1], a[2], a[3], a[4])
    elif a[0] == "header":
        touch_header(a[1], a[2])
    elif a[0] == "old":
        old(a[1])
    elif a[0] in ("drop", "f16"):
        rewrite(a[1], a[2], a[3], a[0])
    else:
        raise SystemExit(__doc__)
