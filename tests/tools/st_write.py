#!/usr/bin/python3
"""tests/tools/st_write.py: safetensors files for the tests, written by the spec.

A file is an 8-byte little-endian header length N, N bytes of JSON header (padded
with spaces to a multiple of 8, as the reference writer does) and the data, the
tensors back to back in the order given. No safetensors package is needed.

  st_write.py fixtures DIR
      The files of tests/integration/test_safetensors.sh and DIR/cases.tsv, the
      checks `test_safetensors DIR` runs on them, with the expected values of
      every tensor beside them (DIR/expect/<file>/<tensor>.f32, .bf16 and, for
      F64 sources, .f64: raw little-endian arrays). Expected values come from
      numpy (f64 -> f32, f16 -> f32), torch (f32 and f16 -> bf16) and an integer
      round-to-nearest-even on the f64 bits (f64 -> bf16: torch rounds twice).
  st_write.py raw OUT [NAME:DTYPE:SHAPE:BEGIN,END ...] [--data N] [--hdrlen N]
                      [--header TEXT] [--meta KEY=VALUE ...]
      One file, malformed on purpose if asked: SHAPE is "2x3" ("" for a scalar),
      the data section is N zero bytes (default: the largest END), --hdrlen
      overrides the length field, --header writes TEXT as the header verbatim.
  st_write.py index OUT TENSOR=FILE ... [--meta KEY=VALUE ...]
      A model.safetensors.index.json (integer-looking metadata values as integers).
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

CHUNK = 4 << 20  # BMT_ST_CHUNK_BYTES: bytes converted per pread
ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
            "U8": 1, "BOOL": 1}


def write_st(path, tensors, metadata=None):
    """tensors: [(name, dtype, shape, raw bytes)]. Returns the header length N."""
    header = {}
    if metadata:
        header["__metadata__"] = metadata
    off = 0
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for t in tensors:
            f.write(t[3])
    return len(text)


# ---------------------------------------------------------------- expected values

def bf16_of_f32(x32):
    """torch's float -> bfloat16 (round to nearest even) as uint16 bits."""
    import torch
    t = torch.from_numpy(np.ascontiguousarray(x32, dtype=np.float32)).to(torch.bfloat16)
    return t.view(torch.int16).numpy().view(np.uint16).copy()


def bf16_of_f16(x16):
    import torch
    t = torch.from_numpy(np.ascontiguousarray(x16, dtype=np.float16)).to(torch.bfloat16)
    return t.view(torch.int16).numpy().view(np.uint16).copy()


def bf16_of_f64(x):
    """Round to nearest even straight from the f64 bits (bf16's normal range only)."""
    u = np.ascontiguousarray(x, dtype=np.float64).view(np.uint64)
    sign = (u >> np.uint64(63)).astype(np.int64)
    e = ((u >> np.uint64(52)) & np.uint64(0x7FF)).astype(np.int64) - 1023
    assert ((e >= -126) & (e <= 127)).all(), "bf16_of_f64 handles bf16 normals only"
    frac = u & np.uint64((1 << 52) - 1)
    keep = (frac >> np.uint64(45)).astype(np.int64)  # the 7 bits bf16 keeps
    rest = frac & np.uint64((1 << 45) - 1)
    half = np.uint64(1 << 44)
    up = ((rest > half) | ((rest == half) & ((keep & 1) == 1))).astype(np.int64)
    mant = keep + up
    e = e + (mant >> 7)
    mant &= 0x7F
    bits = (sign << 15) | ((e + 127) << 7) | mant
    bits = np.where(e + 127 >= 255, (sign << 15) | 0x7F80, bits)
    return bits.astype(np.uint16)


def f32_of_bf16(bits):
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


class Tensor:
    """A tensor to write and what bmt_st_read must give back in f32, bf16, f64."""

    def __init__(self, name, dtype, shape, raw, f32, bf16, f64=None):
        self.name, self.dtype, self.shape, self.raw = name, dtype, tuple(shape), raw
        self.f32, self.bf16, self.f64 = f32, bf16, f64
        self.numel = int(np.prod(shape, dtype=np.int64)) if shape else 1


def make(name, dtype, values, shape=None):
    """A float tensor from float64 values (reshaped to shape)."""
    shape = shape if shape is not None else values.shape
    if dtype == "F32":
        x = values.astype(np.float32)
        return Tensor(name, dtype, shape, x.tobytes(), x, bf16_of_f32(x))
    if dtype == "F16":
        x = values.astype(np.float16)
        return Tensor(name, dtype, shape, x.tobytes(), x.astype(np.float32), bf16_of_f16(x))
    if dtype == "BF16":
        bits = bf16_of_f32(values.astype(np.float32))
        return Tensor(name, dtype, shape, bits.tobytes(), f32_of_bf16(bits), bits)
    assert dtype == "F64"
    x = values.astype(np.float64)
    return Tensor(name, dtype, shape, x.tobytes(), x.astype(np.float32), bf16_of_f64(x), x)


def make_bits(name, dtype, bits):
    """An F16 or BF16 tensor of the given bit patterns (NaN, inf, subnormals...)."""
    bits = bits.astype(np.uint16)
    if dtype == "F16":
        x = bits.view(np.float16)
        with np.errstate(invalid="ignore"):
            return Tensor(name, dtype, bits.shape, bits.tobytes(), x.astype(np.float32),
                          bf16_of_f16(x))
    return Tensor(name, dtype, bits.shape, bits.tobytes(), f32_of_bf16(bits), bits)


def gpt2_names(prefix, layers, C=8, V=64, T=16):
    """HF GPT-2's tensors with their shapes (Conv1D weights are (in, out))."""
    out = [(prefix + "wte.weight", (V, C)), (prefix + "wpe.weight", (T, C))]
    for l in range(layers):
        p = f"{prefix}h.{l}."
        out += [(p + "ln_1.weight", (C,)), (p + "ln_1.bias", (C,)),
                (p + "attn.c_attn.weight", (C, 3 * C)), (p + "attn.c_attn.bias", (3 * C,)),
                (p + "attn.c_proj.weight", (C, C)), (p + "attn.c_proj.bias", (C,)),
                (p + "ln_2.weight", (C,)), (p + "ln_2.bias", (C,)),
                (p + "mlp.c_fc.weight", (C, 4 * C)), (p + "mlp.c_fc.bias", (4 * C,)),
                (p + "mlp.c_proj.weight", (4 * C, C)), (p + "mlp.c_proj.bias", (C,))]
    out += [(prefix + "ln_f.weight", (C,)), (prefix + "ln_f.bias", (C,))]
    return out


# ---------------------------------------------------------------- fixtures

class Fixtures:
    def __init__(self, top):
        self.top = top
        self.rows = []
        self.rng = np.random.default_rng(20240520)

    def path(self, rel):
        p = os.path.join(self.top, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        return p

    def write(self, rel, tensors, metadata=None, unreadable=()):
        """Write a file (tensors, then the raw (name, dtype, shape, bytes) of unreadable)
        and the tensors' expected values; returns 8 + N and {name: absolute offset}."""
        raws = [(t.name, t.dtype, t.shape, t.raw) for t in tensors] + list(unreadable)
        n = write_st(self.path(rel), raws, metadata)
        offsets, off = {}, 8 + n
        for name, _, _, raw in raws:
            offsets[name] = off
            off += len(raw)
        for t in tensors:
            tag = os.path.join("expect", rel.replace("/", "_"), t.name)
            t.f32.astype("<f4").tofile(self.path(tag + ".f32"))
            t.bf16.astype("<u2").tofile(self.path(tag + ".bf16"))
            if t.f64 is not None:
                t.f64.astype("<f8").tofile(self.path(tag + ".f64"))
            t.expect = tag
        return 8 + n, offsets

    def row(self, *fields):
        self.rows.append("\t".join(str(f) for f in fields))

    def list_rows(self, handle, tensors, file, offsets):
        for t in tensors:
            shape = "x".join(str(d) for d in t.shape)
            self.row("tensor", handle, t.name, t.dtype, shape, file, offsets[t.name], len(t.raw))

    def read_rows(self, handle, t, ranges=True):
        n, k = t.numel, CHUNK // ITEMSIZE[t.dtype]
        todo = [(0, n)]
        if ranges:
            todo += [(0, 1), (n - 1, 1), (n // 3 + 1, n // 3), (n, 0)]
            if n > k:  # across the 4 MiB chunk: at it, and reads longer than a chunk
                todo += [(k - 3, 8), (7, k + 5), (1, n - 2)]
        for first, count in todo:
            self.row("read", handle, t.name, first, count, t.expect)

    def gpt2(self):
        """gpt2/model.safetensors: 3 layers of HF GPT-2 names, F32."""
        ts = [make(name, "F32", self.rng.standard_normal(shape) * 0.02)
              for name, shape in gpt2_names("", 3)]
        hdr, offs = self.write("gpt2/model.safetensors", ts, {"format": "pt"})
        for handle in ("gpt2/model.safetensors", "gpt2"):
            self.row("open", handle, len(ts), hdr)
            self.row("plan", handle, "head(2) h.0(12) h.1(12) h.2(12) tail(2)")
        self.row("meta", "gpt2", "format", "pt")
        self.list_rows("gpt2", ts, "model.safetensors", offs)
        for t in ts:
            self.read_rows("gpt2/model.safetensors", t, ranges=t.numel > 100)

    def sharded(self):
        """sharded/: transformer.-prefixed GPT-2 with lm_head over 2 files and an index;
        weights BF16, biases F16, layer norms F32, embeddings F64."""
        names = gpt2_names("transformer.", 3) + [("lm_head.weight", (64, 8))]

        def dtype(name):
            if "wte" in name or "wpe" in name:
                return "F64"
            if ".ln_" in name:
                return "F32"
            return "F16" if name.endswith("bias") else "BF16"

        ts = [make(n, dtype(n), self.rng.standard_normal(s)) for n, s in names]
        files = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
        half = 2 + 12 + 6  # embeddings, layer 0, half of layer 1
        parts = [ts[:half], ts[half:]]
        weight_map, offsets = {}, {}
        hdr_bytes = 0
        for fname, part in zip(files, parts):
            hdr, offs = self.write("sharded/" + fname, part, {"format": "pt"})
            hdr_bytes += hdr
            offsets.update({n: (fname, o) for n, o in offs.items()})
            weight_map.update({t.name: fname for t in part})
        total = sum(len(t.raw) for t in ts)
        index = self.path("sharded/model.safetensors.index.json")
        with open(index, "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
        hdr_bytes += os.path.getsize(index)
        summary = ("head(2) transformer.h.0(12) transformer.h.1(12) transformer.h.2(12) tail(3)")
        for handle in ("sharded", "sharded/model.safetensors.index.json"):
            self.row("open", handle, len(ts), hdr_bytes)
            self.row("plan", handle, summary)
        self.row("meta", "sharded", "total_size", total)
        self.row("meta", "sharded", "format", "pt")
        for t in ts:
            fname, off = offsets[t.name]
            shape = "x".join(str(d) for d in t.shape)
            self.row("tensor", "sharded", t.name, t.dtype, shape, fname, off, len(t.raw))
            self.read_rows("sharded", t, ranges=t.numel > 100)

    def dtypes(self):
        """dtypes.safetensors: every float dtype over more than one 4 MiB chunk, every f16
        and bf16 pattern, f32 specials, f64 values at bf16 ties; and two it cannot read."""
        r = self.rng
        big = lambda n: r.standard_normal(n)  # noqa: E731
        ts = [make("f32.big", "F32", big(1050 * 1000) * 0.5, (1050, 1000)),
              make("f16.big", "F16", big(2100 * 1000), (2100, 1000)),
              make("bf16.big", "BF16", big(2100 * 1000) * 4, (2100, 1000)),
              make("f64.big", "F64", big(525 * 1000) * 3, (525, 1000)),
              make_bits("f16.all", "F16", np.arange(65536)),
              make_bits("bf16.all", "BF16", np.arange(65536))]
        special = np.array([0x00000000, 0x80000000, 0x3F800000, 0x3F808000, 0x3F818000, 0x3F808001,
                            0x7F7F7FFF, 0x7F7F8000, 0x7F7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000,
                            0x00000001, 0x00008000, 0x00018000, 0x00800000, 0xBF818000],
                           dtype=np.uint32).view(np.float32)
        ts.append(make("f32.special", "F32", special.astype(np.float64)))
        # f64 at bf16 ties of random bf16 numbers, exactly and nudged either way
        base = f32_of_bf16(r.integers(0x0100, 0x7E80, 1000).astype(np.uint16)).astype(np.float64)
        ulp = np.ldexp(1.0, np.frexp(base)[1] - 8)  # bf16 ulp at base
        ties = np.concatenate([base + ulp / 2, base + ulp / 2 * (1 + 2.0**-40),
                               base + ulp / 2 * (1 - 2.0**-40)])
        ties[::2] *= -1
        ts.append(make("f64.ties", "F64", ties))
        ids = ("i64.ids", "I64", (4,), np.arange(4, dtype="<i8").tobytes())
        mask = ("u8.mask", "BOOL", (3,), bytes([1, 0, 1]))
        hdr, offs = self.write("dtypes.safetensors", ts, unreadable=(ids, mask))
        self.row("open", "dtypes.safetensors", len(ts) + 2, hdr)
        self.row("plan", "dtypes.safetensors", "head(0) tail(10)")
        self.row("tensor", "dtypes.safetensors", "i64.ids", "I64", "4", "dtypes.safetensors",
                 offs["i64.ids"], 32)
        self.row("tensor", "dtypes.safetensors", "u8.mask", "BOOL", "3", "dtypes.safetensors",
                 offs["u8.mask"], 3)
        self.list_rows("dtypes.safetensors", ts, "dtypes.safetensors", offs)
        for t in ts:
            self.read_rows("dtypes.safetensors", t)

    def truncated(self):
        """trunc.safetensors: read after the file is cut in the middle of tensor w."""
        t = make("w", "F32", self.rng.standard_normal(1000))
        hdr, offs = self.write("trunc.safetensors", [t])
        o = offs["w"]
        self.row("truncread", "trunc.safetensors", "w",
                 f"trunc.safetensors: tensor 'w': file ends at byte {o + 2000}, inside bytes "
                 f"[{o}, {o + 4000}) (truncated after open?)")

    def finish(self):
        with open(os.path.join(self.top, "cases.tsv"), "w") as f:
            f.write("# written by tests/tools/st_write.py fixtures; read by test_safetensors DIR\n")
            f.write("\n".join(self.rows) + "\n")


def cmd_fixtures(args):
    fx = Fixtures(args.dir)
    fx.gpt2()
    fx.sharded()
    fx.dtypes()
    fx.truncated()
    fx.finish()


# ---------------------------------------------------------------- malformed files

def cmd_raw(args):
    header, end = {}, 0
    if args.meta:
        header["__metadata__"] = dict(kv.split("=", 1) for kv in args.meta)
    for spec in args.tensors:
        name, dtype, shape, offs = spec.split(":")
        begin, stop = (int(v) for v in offs.split(","))
        header[name] = {"dtype": dtype, "shape": [int(d) for d in shape.split("x")] if shape else [],
                        "data_offsets": [begin, stop]}
        end = max(end, stop)
    if args.header is not None:
        text = args.header.encode()
    else:
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
    data = args.data if args.data is not None else end
    with open(args.out, "wb") as f:
        f.write(struct.pack("<Q", args.hdrlen if args.hdrlen is not None else len(text)))
        f.write(text)
        f.write(bytes(data))


def cmd_index(args):
    meta = {}
    for kv in args.meta or []:
        k, v = kv.split("=", 1)
        meta[k] = int(v) if v.lstrip("-").isdigit() else v
    wm = dict(e.split("=", 1) for e in args.entries)
    with open(args.out, "w") as f:
        json.dump({"metadata": meta, "weight_map": wm}, f, indent=2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("fixtures")
    p.add_argument("dir")
    p.set_defaults(fn=cmd_fixtures)
    p = sub.add_parser("raw")
    p.add_argument("out")
    p.add_argument("tensors", nargs="*")
    p.add_argument("--data", type=int)
    p.add_argument("--hdrlen", type=int)
    p.add_argument("--header")
    p.add_argument("--meta", action="append")
    p.set_defaults(fn=cmd_raw)
    p = sub.add_parser("index")
    p.add_argument("out")
    p.add_argument("entries", nargs="+")
    p.add_argument("--meta", action="append")
    p.set_defaults(fn=cmd_index)
    args = ap.parse_args()
    args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
