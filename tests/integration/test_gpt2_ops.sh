#!/bin/bash
# The GPT-2 layers in plain C (nn/ops_cpu.c), the reference of the
# CUDA kernels, against PyTorch in float64: tests/tools/gpt2_ops_oracle.py gen
# writes random inputs (fixed seed, odd shapes) and torch's results,
# $PROGS/gpt2_ops_check (tests/progs/gpt2_ops_check.c) runs every op on them, and
# the oracle's compare prints one TAP line per case and tensor with the max
# relative error against its bound: 1e-5 forward, 1e-4 gradients; "+=" lines are
# backward runs into prefilled buffers, which must accumulate. Each op is one
# test here; the oracle's lines follow it as "#" lines. Then the checker is shown
# able to fail: results perturbed by gpt2_ops_check --perturb (a sign flip, 10x
# a bound, a NaN) and a backward that overwrote instead of accumulating must each
# fail the comparison of that tensor only; bad input files are named.
. "$(dirname "$0")/lib.sh"

PY=/usr/bin/python3
ORACLE=$SRC/tests/tools/gpt2_ops_oracle.py
CHECK=$PROGS/gpt2_ops_check
D=$TMP/ops
. "$(dirname "$0")/ops_lib.sh"

test_expect_success "gen writes inputs and torch's results; gpt2_ops_check runs all 14 cases" '
    with_timeout 60 $PY "$ORACLE" gen "$D" &&
    test $(wc -l <"$D/in/cases.txt") -eq 14 &&
    with_timeout 60 "$CHECK" "$D/in" "$D/out" >out &&
    grep -q "^gpt2_ops_check: 14 cases written to $D/out\$" out
'

test_expect_success "encoder: out, dwte, dwpe (a token repeated)" 'compare_ops 5 encoder'
show
test_expect_success "layernorm: out, mean, rstd, dinp, dweight, dbias" 'compare_ops 9 layernorm'
show
test_expect_success "matmul: wt 0 and 1, the tied LM head (no bias, dinp NULL), past the tiles" '
    compare_ops 35 matmul_wt0 matmul_wt1 matmul_head matmul_big_wt0 matmul_big_wt1
'
show
test_expect_success "attention: out, preatt, att, dqkv, scratch dpreatt, datt; scores near 96" '
    compare_ops 14 attention attention_big
'
show
test_expect_success "gelu (tanh approximation): out, dinp, tails at +-12" 'compare_ops 3 gelu'
show
test_expect_success "residual: out, and in place (out = a, out = b)" 'compare_ops 3 residual'
show
test_expect_success "crossentropy: losses, probs, dlogits; ignored target, logits +1000, p = 0; V 1 and 2, a row all ignored, logits -1e30 and +-1e4" '
    compare_ops 12 crossentropy crossentropy_v1 crossentropy_v2
'
show

test_expect_success "the comparison catches one gradient element with its sign flipped" '
    perturbed "attention.dqkv" -1 &&
    grep -q "^gpt2_ops_check: perturbed attention.dqkv\[" log
'

test_expect_success "...a gradient element off by 1e-3 (10x the bound), in the += run too" '
    perturbed "layernorm.dinp" 1.001 &&
    perturbed "matmul_head.dweight_nodinp+=" 1.001
'

test_expect_success "...a forward output off by 1e-4 (10x the bound)" '
    perturbed "matmul_big_wt1.out" 1.0001
'

test_expect_success "...a NaN in an output (as an element a forward left unwritten)" '
    perturbed "gelu.out" nan && grep -q "gelu.out: max rel err inf" compare.out
'

test_expect_success "...a backward that overwrote its gradient instead of adding to it" '
    cp -r "$D/out" out && cp out/encoder.dwpe "out/encoder.dwpe+=" &&
    fails_only encoder "dwpe+="
'

test_expect_success "--perturb with a name that is no output is an error" '
    exits 1 "$CHECK" --perturb attention.nope -1 "$D/in" out &&
    grep -q "^gpt2_ops_check: --perturb attention.nope: no output has that name" err
'

test_expect_success "a short input file is named, with its size and the expected one" '
    cp -r "$D/in" in && head -c 40 "$D/in/layernorm.weight" >in/layernorm.weight &&
    exits 1 "$CHECK" in out &&
    grep -q "^gpt2_ops_check: in/layernorm.weight: 40 bytes, expected 48 (12 float32)\$" err
'

test_expect_success "a missing input file and a token id out of range are named" '
    cp -r "$D/in" in && rm in/gelu.dout &&
    exits 1 "$CHECK" in out &&
    grep -q "^gpt2_ops_check: in/gelu.dout: No such file or directory" err &&
    cp "$D/in/gelu.dout" in/ && printf "\\377\\377\\377\\177" | dd of=in/encoder.inp conv=notrunc 2>/dev/null &&
    exits 1 "$CHECK" in out &&
    grep -q "^gpt2_ops_check: in/encoder.inp: element 0 is 2147483647, outside \[0, 37)" err
'

test_expect_code 2 "a missing argument is a usage error" '"$CHECK" "$D/in" 2>err'

test_done
