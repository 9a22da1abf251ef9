#!/bin/bash
# FP8 in plain C (nn/fp8.c, the reference of the FP8 kernels) against the formats'
# definitions: tests/tools/fp8_oracle.py decodes the 256 codes of E4M3 and E5M2
# from their fields and converts by searching for the nearest value, and
# $PROGS/fp8_check runs nn/fp8.h on the oracle's inputs: every bf16 bit pattern,
# every tie between two FP8 values and its f32 neighbours, values beyond the
# largest, inf, NaN, -0; a tensor quantized with six scales (saturation counted);
# the current-scaling roundtrip; the scale for a dozen amax values (0, tiny,
# NaN, inf, negative); a scaled E4M3 x E5M2 product; and a linear layer's
# products emulated as the FP8 mode computes them (forward and backward, both
# weight layouts; a NaN or inf operand refused). Every comparison is bit for
# bit but the products' (f32's rounding of exact sums). Then the checker
# is shown able to fail: ties rounded away from zero, one code changed, a
# saturation count off by one, a product off by 4 ulp each fail their line.
. "$(dirname "$0")/lib.sh"

PY=/usr/bin/python3
ORACLE=$SRC/tests/tools/fp8_oracle.py
CHECK=$PROGS/fp8_check
D=$TMP/fp8

if ! $PY -c 'import numpy' 2>/dev/null; then
    test_expect_success "$PY can import numpy (the oracle needs it)" 'false'
    test_done
    exit
fi

test_expect_success "gen writes the inputs; fp8_check converts, quantizes and multiplies them" '
    with_timeout 120 $PY "$ORACLE" gen "$D" &&
    with_timeout 60 "$CHECK" "$D" >out &&
    grep -q "^fp8_check: [0-9]* values, 6 x 4096 quantized, 37 x 300 x 29 product, 45 x 96 x 40 layer written to $D\$" out
'

test_expect_success "every result equals the oracle's (29 comparisons)" '
    with_timeout 120 $PY "$ORACLE" compare "$D" >"$TMP/compare.out" &&
    test $(grep -c "^ok " "$TMP/compare.out") -eq 29 && ! grep -q "^not ok" "$TMP/compare.out"
'
grep "ok \|^#" "$TMP/compare.out" | sed -e 's/^/#   /'

# fails DIR PATTERN: the comparison of DIR fails on exactly one line, matching PATTERN.
fails() {
    test_must_fail with_timeout 120 $PY "$ORACLE" compare "$1" >compare.out &&
        test $(grep -c "^not ok" compare.out) -eq 1 && grep -q "^not ok [0-9]* - $2" compare.out ||
        { cat compare.out; false; }
}

test_expect_success "the comparison catches E4M3 ties rounded away from zero, and one E5M2 code changed" '
    cp -r "$D" d && $PY -c "
import numpy as np, sys
sys.path.insert(0, \"$SRC/tests/tools\")
import fp8_oracle as o
x = np.fromfile(\"d/x.f32\", np.float32).astype(np.float64)
dec = o.decode_table(\"e4m3\")
c = o.encode(x, \"e4m3\").astype(np.int64)
a = np.abs(x)
v = np.abs(dec[c])
up = np.abs(dec[np.minimum((c & 0x7f) + 1, 0x7e)])
tie = np.isfinite(a) & (a < 448) & (np.abs(up - a) == np.abs(a - v)) & (up > v)
print(\"ties\", int(tie.sum()))
c[tie] += 1
c.astype(np.uint8).tofile(\"d/encode_e4m3.u8\")
e = np.fromfile(\"d/encode_e5m2.u8\", np.uint8)
e[1000] ^= 1
e.tofile(\"d/encode_e5m2.u8\")
" >ties && grep -q "^ties [1-9]" ties &&
    cp -r "$D" d1 && cp d/encode_e4m3.u8 d1/ && fails d1 "e4m3: [0-9]* values" &&
    cp -r "$D" d2 && cp d/encode_e5m2.u8 d2/ && fails d2 "e5m2: [0-9]* values"
'

test_expect_success "...a saturation count off by one, and a product off by 4 ulp" '
    cp -r "$D" d && sed -i "2s/ [0-9]*\$/ 1439/" d/quant_e4m3.txt && fails d "e4m3: quantize with scale 977" &&
    cp -r "$D" p && $PY -c "
import numpy as np
m = np.fromfile(\"p/mm.f32\", np.float32)
i = int(np.argmax(np.abs(m)))
m.view(np.uint32)[i] += 4
m.tofile(\"p/mm.f32\")
" && fails p "the scaled product"
'

test_expect_success "...and delayed scaling with one pass computed at the current scale, or a saturation not counted" '
    cp -r "$D" dl && $PY -c "
import numpy as np, sys
sys.path.insert(0, \"$SRC/tests/tools\")
import fp8_oracle as o
x = np.fromfile(\"dl/lin_inp.f32\", np.float32)
x[3] = 0.5
w = np.fromfile(\"dl/lin_w.f32\", np.float32)
N, IC, OC = 45, 96, 40
xr = o.roundtrip((x * np.float32(4)).astype(np.float32), \"e4m3\").reshape(N, IC).astype(np.float64)
wr = o.roundtrip(w, \"e4m3\").reshape(IC, OC).astype(np.float64)
b = np.fromfile(\"dl/lin_b.f32\", np.float32).astype(np.float64)
(xr @ wr + b).astype(np.float32).tofile(\"dl/dl_out_4.f32\")
" && fails dl "delayed scaling over 6 passes" &&
    cp -r "$D" ds && echo "6 1 1" >ds/dl_stats.txt && fails ds "delayed scaling over 6 passes"
'

test_expect_success "a missing input is named; a bad mm.txt is named; no argument is a usage error" '
    cp -r "$D" d && rm d/qx.f32 &&
    exits 1 "$CHECK" d && grep -q "^fp8_check: d/qx.f32: No such file or directory" err &&
    cp -r "$D" e && echo "3 4" >e/mm.txt &&
    exits 1 "$CHECK" e && grep -q "^fp8_check: e/mm.txt: not \"N K OC KA KB DESCALE\"" err &&
    exits 2 "$CHECK"
'

test_done
