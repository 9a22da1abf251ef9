#!/bin/bash
# The Llama layers in plain C (nn/llama_ops_cpu.c), the reference of the CUDA
# kernels, against PyTorch in float64: tests/tools/llama_ops_oracle.py gen writes
# random inputs (fixed seed, odd shapes, T 1 to 3000, head sizes 8 to 130, GQA
# ratios 1, 2, 3, 4 and 8, rms_norm_eps 1e-12 to 1e-2, RoPE with and without
# Llama 3's scaling, theta 10 to 1e9) and torch's results, $PROGS/llama_ops_check
# (tests/progs/llama_ops_check.c) runs every op on them, and the oracle's compare
# prints one TAP line per case and tensor with the max relative error against its
# bound: 1e-5 forward, 1e-4 gradients; "+=" lines are backward runs into
# prefilled buffers, which must accumulate. Each op is one test here; the
# oracle's lines follow it as "#" lines. Then the checker is shown able to fail:
# results perturbed by llama_ops_check --perturb (a sign flip, 10x a bound, a
# NaN), a backward that overwrote instead of accumulating, RoPE on interleaved
# pairs and Llama 3 frequencies left unscaled must each fail the comparison of
# that tensor only; bad input files are named.
. "$(dirname "$0")/lib.sh"

PY=/usr/bin/python3
ORACLE=$SRC/tests/tools/llama_ops_oracle.py
CHECK=$PROGS/llama_ops_check
D=$TMP/ops
. "$(dirname "$0")/ops_lib.sh"

test_expect_success "gen writes inputs and torch's results; llama_ops_check runs all 28 cases" '
    with_timeout 120 $PY "$ORACLE" gen "$D" &&
    test $(wc -l <"$D/in/cases.txt") -eq 28 &&
    with_timeout 60 "$CHECK" "$D/in" "$D/out" >out &&
    grep -q "^llama_ops_check: 28 cases written to $D/out\$" out
'

test_expect_success "rmsnorm: out, rstd, dinp, dweight; eps 1e-5 and 1e-6 (a row with mean(x^2) ~ eps), 1e-12 (a row of zeros, rows of 1e-7 and 1e-20) and 1e-2" '
    compare_ops 24 rmsnorm rmsnorm_eps6 rmsnorm_eps12 rmsnorm_eps2
'
show
test_expect_success "rope_freqs: theta^(-2i/hd), and Llama 3 scaling with all three bands (hd 8, 16, 128; theta 10 at hd 24, 1e9 at hd 80)" '
    compare_ops 6 freqs_hd8 freqs_hd8_llama3 freqs_hd16_llama3 freqs_hd128_llama3 \
        freqs_hd24_theta10 freqs_hd80_theta1e9_llama3
'
show
test_expect_success "rope (rotate_half): out, in place, dinp; hd 8, 16, 24, 64; positions up to 2999" '
    compare_ops 20 rope_hd8 rope_llama3 rope_long rope_hd64 rope_hd24
'
show
test_expect_success "swiglu: out, dgate, dup; gate at +-40" 'compare_ops 5 swiglu'
show
test_expect_success "attention: out, lse, dq, dk, dv; MHA, GQA 2, 3, 4 and 8, MQA at hd 64 and 96; T 1 and 67; hd 24, 40, 130; scores near 1000" '
    compare_ops 74 attn_mha attn_gqa2 attn_gqa4 attn_hd64 attn_hd96 attn_big \
        attn_t1 attn_gqa3 attn_hd40 attn_hd130
'
show
test_expect_success "matmul (nn.Linear, no bias): out, dinp, dweight, dinp NULL, past the tiles" '
    compare_ops 14 matmul matmul_big
'
show

test_expect_success "the comparison catches one gradient element with its sign flipped" '
    perturbed "attn_gqa4.dk" -1 &&
    grep -q "^llama_ops_check: perturbed attn_gqa4.dk\[" log
'

test_expect_success "...a gradient element off by 1e-3 (10x the bound), in the += runs too" '
    perturbed "rmsnorm.dinp" 1.001 &&
    perturbed "rope_llama3.dinp+=" 1.001 &&
    perturbed "matmul.dweight_nodinp+=" 1.001
'

test_expect_success "...a forward output off by 1e-4 (10x the bound)" '
    perturbed "rope_hd64.out" 1.0001 &&
    perturbed "freqs_hd128_llama3.inv_freq" 1.0001
'

test_expect_success "...a NaN in an output (as an element a forward left unwritten)" '
    perturbed "swiglu.out" nan && grep -q "swiglu.out: max rel err inf" compare.out
'

test_expect_success "...a backward that overwrote its gradient instead of adding to it" '
    cp -r "$D/out" out && cp out/attn_gqa2.dv "out/attn_gqa2.dv+=" &&
    fails_only attn_gqa2 "dv+="
'

# The two conventions that are easy to get wrong, written with numpy over the
# checker's inputs: RoPE rotating pairs (2i, 2i+1) instead of (i, i + hd/2), and
# Llama 3 frequencies without their scaling (only the divided and interpolated
# ones differ: those under 1e-3, which inv_freq'"'"'s floor 0 judges one by one).
test_expect_success "...RoPE on interleaved pairs, and Llama 3 frequencies left unscaled" '
    cp -r "$D/out" out &&
    $PY -c "
import numpy as np, sys
d, o = sys.argv[1], sys.argv[2]
B, T, NH, hd = 2, 13, 2, 16
x = np.fromfile(d + \"/rope_llama3.inp\", \"<f4\").astype(np.float64).reshape(B, T, NH, hd)
f = np.fromfile(d + \"/rope_llama3.inv_freq\", \"<f4\").astype(np.float64)
a = np.arange(T)[:, None] * f[None, :]
c, s = np.cos(a)[None, :, None, :], np.sin(a)[None, :, None, :]
y = x.copy()
y[..., 0::2] = x[..., 0::2] * c - x[..., 1::2] * s
y[..., 1::2] = x[..., 1::2] * c + x[..., 0::2] * s
y.astype(\"<f4\").tofile(o + \"/rope_llama3.out\")
(1.0 / 500000.0 ** (np.arange(0, 16, 2) / 16)).astype(\"<f4\").tofile(o + \"/freqs_hd16_llama3.inv_freq\")
" "$D/in" out &&
    fails_only rope_llama3 "out" && fails_only freqs_hd16_llama3 "inv_freq"
'

test_expect_success "--perturb with a name that is no output is an error" '
    exits 1 "$CHECK" --perturb attn_mha.nope -1 "$D/in" out &&
    grep -q "^llama_ops_check: --perturb attn_mha.nope: no output has that name" err
'

test_expect_success "a short input file is named, with its size and the expected one" '
    cp -r "$D/in" in && head -c 40 "$D/in/rmsnorm.weight" >in/rmsnorm.weight &&
    exits 1 "$CHECK" in out &&
    grep -q "^llama_ops_check: in/rmsnorm.weight: 40 bytes, expected 96 (24 float32)\$" err
'

test_expect_success "a missing input file, a bad case line and NH not a multiple of NKV are named" '
    cp -r "$D/in" in && rm in/swiglu.dout &&
    exits 1 "$CHECK" in out &&
    grep -q "^llama_ops_check: in/swiglu.dout: No such file or directory" err &&
    cp "$D/in/swiglu.dout" in/ && sed -i "s/eps=1e-05/eps=x/" in/cases.txt &&
    exits 1 "$CHECK" in out &&
    grep -q "^llama_ops_check: in/cases.txt:1: not \"<case> <op> key=value...\": rmsnorm rmsnorm" err &&
    cp "$D/in/cases.txt" in/ && sed -i "s/^attn_gqa2 attention B=2 T=13 NH=4 NKV=2/attn_gqa2 attention B=2 T=13 NH=4 NKV=3/" in/cases.txt &&
    exits 1 "$CHECK" in out &&
    grep -q "^llama_ops_check: case attn_gqa2: NH=4 is not a multiple of NKV=3" err
'

test_expect_code 2 "a missing argument is a usage error" '"$CHECK" "$D/in" 2>err'

test_done
