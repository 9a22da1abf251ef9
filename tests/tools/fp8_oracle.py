#!/usr/bin/python3
"""tests/tools/fp8_oracle.py — FP8 (E4M3, E5M2) from the formats' definitions, the
independent reference of nn/fp8.c (tests/integration/test_fp8.sh).

  fp8_oracle.py gen DIR       inputs for tests/progs/fp8_check
  fp8_oracle.py compare DIR   its results against this file's, one TAP line each

The 256 codes of each format are decoded from sign, exponent and mantissa fields
(OCP FP8 v1.0); a value is converted by searching the sorted finite values for the
nearest (ties to the even mantissa), values beyond the largest finite one
saturate to it, NaN gives 0x7f with the sign. Nothing here shares code with
nn/fp8.c, which rounds by scaling to the binade's quantum instead.
"""
import sys

import numpy as np

KINDS = {
    "e4m3": dict(ebits=4, mbits=3, bias=7, max=448.0),
    "e5m2": dict(ebits=5, mbits=2, bias=15, max=57344.0),
}


def decode_table(kind):
    k = KINDS[kind]
    out = np.zeros(256)
    for c in range(256):
        s = -1.0 if c & 0x80 else 1.0
        e = (c >> k["mbits"]) & ((1 << k["ebits"]) - 1)
        m = c & ((1 << k["mbits"]) - 1)
        top = (1 << k["ebits"]) - 1
        if kind == "e4m3" and e == top and m == (1 << k["mbits"]) - 1:
            v = np.nan
        elif kind == "e5m2" and e == top:
            v = s * np.inf if m == 0 else np.nan
        elif e == 0:
            v = s * (m / 2.0 ** k["mbits"]) * 2.0 ** (1 - k["bias"])
        else:
            v = s * (1 + m / 2.0 ** k["mbits"]) * 2.0 ** (e - k["bias"])
        out[c] = v
    return out


def encode(x, kind):
    """codes (uint8) of float values x (float64 array holding float32 values)"""
    with np.errstate(all="ignore"):  # NaN and inf pass through the search
        return _encode(x, kind)


def _encode(x, kind):
    dec = decode_table(kind)
    pos = [c for c in range(128) if np.isfinite(dec[c])]
    vals = dec[pos]  # ascending with the code
    assert np.all(np.diff(vals) > 0)
    a = np.abs(x)
    sign = np.where(np.signbit(x), 0x80, 0).astype(np.int64)
    hi = np.clip(np.searchsorted(vals, a), 0, len(vals) - 1)
    lo = np.clip(hi - 1, 0, len(vals) - 1)
    with np.errstate(invalid="ignore"):
        dlo, dhi = np.abs(a - vals[lo]), np.abs(vals[hi] - a)
    codes_lo, codes_hi = np.array(pos)[lo], np.array(pos)[hi]
    pick = np.where(dlo < dhi, codes_lo, np.where(dhi < dlo, codes_hi,
                    np.where(codes_lo % 2 == 0, codes_lo, codes_hi)))
    pick = np.where(a >= KINDS[kind]["max"], pos[-1], pick)
    pick = np.where(np.isnan(a), 0, pick)
    out = (pick | sign).astype(np.int64)
    out = np.where(np.isnan(x), 0x7F | sign, out)
    return out.astype(np.uint8)


def saturates(y, x, kind):
    """x finite and y = x * scale rounds (unbounded exponent) above the largest value"""
    k = KINDS[kind]
    q = 2.0 ** (np.floor(np.log2(k["max"])) - k["mbits"])  # quantum of the top binade
    thr = k["max"] + q / 2
    # at the tie, the larger candidate's mantissa is even for E5M2 (2^16), odd for E4M3 (480)
    tie_up = kind == "e5m2"
    a = np.abs(y)
    with np.errstate(invalid="ignore"):
        s = (a > thr) | ((a == thr) & tie_up) | np.isinf(a)
    return int(np.sum(s & np.isfinite(x)))


def scale_of(amax, kind, margin):
    amax = np.float32(amax)
    if np.isnan(amax) or np.isinf(amax) or amax < 0:
        return np.float32(0)
    if amax == 0:
        return np.float32(1)
    with np.errstate(over="ignore", divide="ignore"):
        s = np.float32(KINDS[kind]["max"]) / amax
        s = np.float32(np.ldexp(s, -margin))
    return s if np.isfinite(s) and s > 0 else np.float32(0)


def gen(d):
    import os
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(8)
    xs = [np.arange(1 << 16, dtype=np.uint32).astype(np.uint32) << 16]  # every bf16
    xs = [xs[0].view(np.float32)]
    for kind in KINDS:
        dec = decode_table(kind)
        v = np.sort(dec[np.isfinite(dec) & (dec >= 0)])
        mid = ((v[1:] + v[:-1]) / 2).astype(np.float32)  # exact ties
        xs += [mid, np.nextafter(mid, np.float32(np.inf)), np.nextafter(mid, np.float32(0))]
        m = np.float32(KINDS[kind]["max"])
        q = np.float32(2.0 ** (np.floor(np.log2(m)) - KINDS[kind]["mbits"]))
        near = np.array([m, m + q / 2, m + q, 2 * m, 3e38], dtype=np.float32)
        xs += [near, np.nextafter(near, np.float32(0)), np.nextafter(near, np.float32(np.inf))]
    xs.append(np.float32(2.0) ** rng.uniform(-20, 20, 20000).astype(np.float32))
    x = np.concatenate(xs).astype(np.float32)
    x = np.concatenate([x, -x, np.array([np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0], np.float32)])
    x.tofile(f"{d}/x.f32")
    qx = (rng.standard_normal(4096) * np.exp(rng.uniform(-6, 3, 4096))).astype(np.float32)
    qx[17] = 1e-30  # far below E5M2's smallest subnormal at any sane scale
    qx.tofile(f"{d}/qx.f32")
    amax = float(np.max(np.abs(qx)))
    scales = [448 / amax, 57344 / amax, 1.0, 1e3, 1e-2, 448 / amax * 8]
    np.array(scales, np.float32).tofile(f"{d}/scales.f32")
    am = np.array([amax, 1.0, 448.0, 3e-36, 1e-38, 1e-45, 3e38, 0.0, -1.0, np.inf, np.nan, 7.25e-3],
                  np.float32)
    am.tofile(f"{d}/amax.f32")
    N, K, OC = 37, 300, 29
    a = rng.integers(0, 256, (N, K), dtype=np.uint8)
    b = rng.integers(0, 256, (OC, K), dtype=np.uint8)
    for arr, kind in ((a, "e4m3"), (b, "e5m2")):  # finite codes only: a real tensor's
        dec = decode_table(kind)
        bad = ~np.isfinite(dec[arr])
        arr[bad] = 0x3A
    a.tofile(f"{d}/mm_a.u8")
    b.tofile(f"{d}/mm_b.u8")
    with open(f"{d}/mm.txt", "w") as f:
        f.write(f"{N} {K} {OC} 0 1 0.00123\n")
    N, IC, OC = 45, 96, 40  # a layer: activations of some spread, small weights, gradients
    (rng.standard_normal((N, IC)) * np.exp(rng.uniform(-2, 1, (N, IC)))).astype(np.float32) \
        .tofile(f"{d}/lin_inp.f32")
    (rng.standard_normal((IC, OC)) * 0.02).astype(np.float32).tofile(f"{d}/lin_w.f32")
    rng.standard_normal(OC).astype(np.float32).tofile(f"{d}/lin_b.f32")
    (rng.standard_normal((N, OC)) * 1e-4).astype(np.float32).tofile(f"{d}/lin_dout.f32")
    with open(f"{d}/lin.txt", "w") as f:
        f.write(f"{N} {IC} {OC}\n")


def roundtrip(x, kind):
    """x through kind at its current scale, float32, as the GPU's FP8 copy reads back"""
    s = scale_of(np.max(np.abs(x)), kind, 0)
    q = encode((x * s).astype(np.float32).astype(np.float64), kind)
    return (decode_table(kind)[q].astype(np.float32) / s).astype(np.float32)


class Tap:
    def __init__(self):
        self.n = 0
        self.failed = 0

    def ok(self, cond, what, detail=""):
        self.n += 1
        if not cond:
            self.failed += 1
        print(f"{'ok' if cond else 'not ok'} {self.n} - {what}")
        if detail and not cond:
            for line in detail.splitlines()[:12]:
                print(f"#   {line}")


def read_text(path):
    with open(path) as f:
        return f.read()


def same_f32(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))


def compare(d):
    t = Tap()
    x = np.fromfile(f"{d}/x.f32", np.float32)
    qx = np.fromfile(f"{d}/qx.f32", np.float32)
    scales = np.fromfile(f"{d}/scales.f32", np.float32)
    am = np.fromfile(f"{d}/amax.f32", np.float32)
    for kind in KINDS:
        dec = decode_table(kind)
        got = np.fromfile(f"{d}/decode_{kind}.f32", np.float32)
        eq = same_f32(got, dec.astype(np.float32))
        t.ok(got.size == 256 and eq.all(), f"{kind}: the 256 codes decode as the format defines",
             "\n".join(f"code {c:#04x}: got {got[c]!r}, want {dec[c]!r}" for c in np.nonzero(~eq)[0]))
        with np.errstate(invalid="ignore"):  # signalling NaNs among the bf16 patterns
            want = encode(x.astype(np.float64), kind)
        got = np.fromfile(f"{d}/encode_{kind}.u8", np.uint8)
        bad = np.nonzero(got != want)[0]
        t.ok(got.size == x.size and bad.size == 0,
             f"{kind}: {x.size} values (every bf16, every tie and its neighbours, beyond the "
             "largest, inf, nan, -0) convert to the nearest code, ties to even, saturating",
             "\n".join(f"x={x[i]!r} ({x[i].view(np.uint32):#010x}): got {got[i]:#04x}, "
                       f"want {want[i]:#04x}" for i in bad[:10]))
        lines = read_text(f"{d}/quant_{kind}.txt").split("\n")
        for s, line in enumerate(lines[:len(scales)]):
            i, m, sat = line.split()
            y = (qx * scales[s]).astype(np.float32)
            want = encode(y.astype(np.float64), kind)
            got = np.fromfile(f"{d}/quant_{kind}_{s}.u8", np.uint8)
            wsat = saturates(y.astype(np.float64), qx, kind)
            wamax = np.float32(np.max(np.abs(qx)))
            t.ok((got == want).all() and int(sat) == wsat and np.float32(m) == wamax,
                 f"{kind}: quantize with scale {scales[s]:.6g}: codes of float32(x * scale), "
                 f"amax {wamax:.6g}, {wsat} saturated",
                 f"codes differ at {np.count_nonzero(got != want)}; saturated {sat} want {wsat}; "
                 f"amax {m} want {wamax}")
        s = scale_of(np.max(np.abs(qx)), kind, 0)
        want = (dec[encode((qx * s).astype(np.float32).astype(np.float64), kind)].astype(np.float32)
                / s).astype(np.float32)
        got = np.fromfile(f"{d}/rt_{kind}.f32", np.float32)
        gs = np.float32(read_text(f"{d}/rt_{kind}.txt"))
        normal = np.abs(qx) * s >= 2.0 ** (2 - 2 ** (KINDS[kind]["ebits"] - 1))
        rel = np.max(np.abs(got[normal].astype(np.float64) - qx[normal]) / np.abs(qx[normal]))
        t.ok(same_f32(got, want).all() and gs == s,
             f"{kind}: roundtrip with the current scale {s:.6g}: dequantize(quantize(x)) bit for bit",
             f"scale {gs} want {s}; {np.count_nonzero(~same_f32(got, want))} values differ")
        print(f"#   {kind}: largest relative change of a value in the normal range {rel:.4g}"
              f" (bound 2^-{KINDS[kind]['mbits'] + 1}); {np.count_nonzero(~normal)} of {qx.size}"
              " below it")
        for margin in (0, 3):
            got = np.fromfile(f"{d}/scale_{kind}_{margin}.f32", np.float32)
            want = np.array([scale_of(a, kind, margin) for a in am], np.float32)
            eq = same_f32(got, want)
            t.ok(eq.all(), f"{kind}: scale = max / amax (f32) / 2^{margin}; amax 0 gives 1; "
                 "NaN, inf, negative, or too small to scale give 0",
                 "\n".join(f"amax {am[i]!r}: got {got[i]!r}, want {want[i]!r}"
                           for i in np.nonzero(~eq)[0]))
    N, K, OC, ka, kb, descale = read_text(f"{d}/mm.txt").split()
    N, K, OC = int(N), int(K), int(OC)
    da = decode_table(["e4m3", "e5m2"][int(ka)])
    db = decode_table(["e4m3", "e5m2"][int(kb)])
    a = da[np.fromfile(f"{d}/mm_a.u8", np.uint8).reshape(N, K)]
    b = db[np.fromfile(f"{d}/mm_b.u8", np.uint8).reshape(OC, K)]
    dsc = float(np.float32(descale))
    ref = a @ b.T * dsc
    sabs = np.abs(a) @ np.abs(b).T * dsc
    got = np.fromfile(f"{d}/mm.f32", np.float32).reshape(N, OC).astype(np.float64)
    err = np.abs(got - ref)
    tol = 2.0 ** -23 * np.abs(ref) + 1e-13 * sabs  # one ulp: numpy sums in another order
    t.ok((err <= tol).all(), f"the scaled product E4M3 x E5M2 ({N}x{K} by {OC}x{K}) within "
         "f32's rounding of the exact sum", f"largest error / bound {np.max(err / tol):.3g}")
    N, IC, OC = (int(v) for v in read_text(f"{d}/lin.txt").split())
    x = np.fromfile(f"{d}/lin_inp.f32", np.float32).reshape(N, IC)
    w = np.fromfile(f"{d}/lin_w.f32", np.float32)
    b = np.fromfile(f"{d}/lin_b.f32", np.float32).astype(np.float64)
    g = np.fromfile(f"{d}/lin_dout.f32", np.float32).reshape(N, OC)
    xr = roundtrip(x, "e4m3").astype(np.float64)
    gr = roundtrip(g, "e5m2").astype(np.float64)
    for wt in (0, 1):
        W = roundtrip(w, "e4m3").astype(np.float64).reshape((IC, OC) if wt == 0 else (OC, IC))
        Wio = W if wt == 0 else W.T  # (IC, OC)
        want = {"out": xr @ Wio + b, "dinp": gr @ Wio.T,
                "dw": xr.T @ gr if wt == 0 else gr.T @ xr, "db": g.astype(np.float64).sum(0)}
        errs = {}
        for k, v in want.items():
            got = np.fromfile(f"{d}/lin_{k}_{wt}.f32", np.float32).astype(np.float64).reshape(v.shape)
            errs[k] = np.linalg.norm(got - v) / np.linalg.norm(v)
        layout = "Conv1D (IC,OC)" if wt == 0 else "Linear (OC,IC)"
        t.ok(errs["out"] <= 1e-6, f"emulated layer, weight {layout}: out from inp and weight "
             f"through E4M3 (rel err {errs['out']:.2g}, bound 1e-6)")
        t.ok(max(errs["dinp"], errs["dw"], errs["db"]) <= 1e-6,
             f"emulated layer, weight {layout}: dinp, dweight from dout through E5M2, dbias from "
             f"dout (rel err {max(errs['dinp'], errs['dw'], errs['db']):.2g}, bound 1e-6)")
    rf, rb, rd, untouched = (int(v) for v in read_text(f"{d}/lin_nan.txt").split())
    t.ok((rf, rb, rd, untouched) == (1, 1, 1, 1),
         "emulated layer: a NaN in inp or an inf in dout returns 1 and makes out, dinp and dweight "
         "all NaN", f"forward {rf}, backward {rb}, with inf dout {rd}, all NaN {untouched}")
    # delayed scaling (nn_fp8_plan_t, history 3), its bookkeeping written out
    # here from docs/fp8.md: pass 0 at each operand's own amax, then each at
    # the largest finite record of its last 3 passes; an infinity becomes NaN
    fac = [1.0, 2.0, 0.5, 1.0, 4.0, 1.0]
    x = x.copy()
    x.reshape(-1)[3] = 0.5  # as fp8_check leaves it after its NaN test
    hist = {"x": [], "w": [], "g": []}
    kinds = {"x": "e4m3", "w": "e4m3", "g": "e5m2"}
    sat = unsc = 0
    w2 = w.reshape(IC, OC)
    bad = []
    for p, f in enumerate(fac):
        xp = (x * np.float32(f)).astype(np.float32)
        if p == 3:
            xp.reshape(-1)[5] = np.inf
        ops = {"x": xp, "w": w2, "g": g}
        recs = {k: np.float32(np.max(np.abs(v))) for k, v in ops.items()}
        if p == 0:
            sc = {k: scale_of(recs[k], kinds[k], 0) for k in ops}
        else:
            sc = {}
            for k in ops:
                fin = [r for r in hist[k][-3:] if np.isfinite(r)]
                sc[k] = scale_of(max(fin), kinds[k], 0) if fin else np.float32(0)
        thr = {}
        for k, v in ops.items():
            if sc[k] == 0 or (p == 0 and not np.isfinite(recs[k])):
                thr[k] = np.full(v.shape, np.nan)
                continue
            y = np.where(np.isinf(v), np.nan, (v * sc[k]).astype(np.float32)).astype(np.float64)
            q = encode(y, kinds[k])
            thr[k] = (decode_table(kinds[k])[q].astype(np.float32) / sc[k]).astype(np.float64)
        xr, Wr, gr = thr["x"], thr["w"], thr["g"]
        want = {"out": xr @ Wr + b, "dinp": gr @ Wr.T, "dw": xr.T @ gr,
                "db": g.astype(np.float64).sum(0)}
        for k, v in want.items():
            got = np.fromfile(f"{d}/dl_{k}_{p}.f32", np.float32).astype(np.float64).reshape(v.shape)
            nan = np.isnan(v)  # the infinity's NaN reaches only what it enters
            if (np.isnan(got) != nan).any():
                bad.append(f"pass {p} {k}: NaN at {int(np.isnan(got).sum())} places, want "
                           f"{int(nan.sum())}")
            elif np.linalg.norm(got[~nan] - v[~nan]) > 1e-6 * np.linalg.norm(v[~nan]):
                e = np.linalg.norm(got[~nan] - v[~nan]) / np.linalg.norm(v[~nan])
                bad.append(f"pass {p} {k}: rel err {e:.2g}")
        for k in ops:
            r = recs[k]
            if not np.isfinite(r):
                unsc += 1
            elif p > 0 and np.float32(r * sc[k]) > {"e4m3": 464.0, "e5m2": 61440.0}[kinds[k]]:
                sat += 1
            hist[k].append(r)
            fin = [v for v in hist[k][-3:] if np.isfinite(v)]  # the next pass's scale
            unsc += 0 if fin else 1
    got = tuple(int(v) for v in read_text(f"{d}/dl_stats.txt").split())
    t.ok(not bad and got == (6, sat, unsc) and sat == 2 and unsc == 1,
         "delayed scaling over 6 passes (history 3): every pass's out, dinp, dweight, dbias within "
         "1e-6 of the oracle's bookkeeping (pass 3's inf: NaN where it enters; passes 1 and 4 grow past the window: saturated), statistics "
         "(passes, saturated, unscalable) equal",
         "\n".join(bad) + f"\nstats {got}, want {(6, sat, unsc)}")
    print(f"1..{t.n}")
    return 1 if t.failed else 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("gen", "compare"):
        sys.exit("usage: fp8_oracle.py gen|compare DIR")
    if sys.argv[1] == "gen":
        gen(sys.argv[2])
    else:
        sys.exit(compare(sys.argv[2]))
