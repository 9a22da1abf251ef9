#!/bin/bash
# The GPT-2 example (examples/gpt2) on CPU ranks through bmlaunch:
# - PyTorch as the oracle (tests/tools/gpt2_oracle.py, float64): the same GPT-2
#   from the same safetensors file (HF names, each rank reading its own shards),
#   logits, loss and every gradient of the first step, and the loss over 10
#   AdamW steps, in layouts 1x1, 2x2, 1x4 and 4x1 and with zero 2 / no
#   checkpointing;
# - the trainer (bin/gpt2) on the shipped corpus: the loss falls, the step line,
#   validation, --init-from, and bad input refused with a clear message.
. "$(dirname "$0")/lib.sh"

PY=/usr/bin/python3
ORACLE=$SRC/tests/tools/gpt2_oracle.py
GPT2=$BUILDDIR/bin/gpt2
export BMT_TIMEOUT=60

$PY "$ORACLE" make "$TMP" || echo "# the oracle could not make its files"

# oracle W LAYOUT-ARGS -- extra gpt2_check args
oracle() {
    local w=$1 rc=0
    shift
    rm -rf after
    with_timeout 120 "$BMLAUNCH" --metrics-port 0 "$@" >out 2>err || rc=$?
    [ $rc -eq 0 ] || { echo "gpt2_check exit $rc"; tail -5 err; return 1; }
    sed 's/^0: //' out >out.txt
    $PY "$ORACLE" check "$PWD" $w 2 16 out.txt
}

for layout in 1x1 2x2 1x4 4x1; do
    g=${layout%x*} n=${layout#*x}
    test_expect_success "GPT-2 ${g}x${n} against PyTorch: logits, loss, every gradient, 10 AdamW steps" "
        cp \$TMP/model.safetensors \$TMP/data.bin . &&
        oracle $((g * n)) -g $g -n $n -- \$PROGS/gpt2_check --init model.safetensors --data data.bin \
            --heads 4 -b 2 -t 16 --out . >check.txt &&
        cat check.txt && test \$(grep -c '^ok ' check.txt) -eq 7
    "
done

test_expect_success "GPT-2 2x2 with zero level 2 and no activation checkpointing against PyTorch" '
    cp $TMP/model.safetensors $TMP/data.bin . &&
    oracle 4 -g 2 -n 2 -- $PROGS/gpt2_check --init model.safetensors --data data.bin \
        --heads 4 -b 2 -t 16 --out . --zero 2 --ckpt 0
'

test_expect_success "the oracle catches a wrong gradient (one parameter moved after the fact)" '
    cp $TMP/model.safetensors $TMP/data.bin . &&
    oracle 1 -n 1 -- $PROGS/gpt2_check --init model.safetensors --data data.bin \
        --heads 4 -b 2 -t 16 --out . &&
    $PY -c "
import numpy as np
f = \"after/transformer.h.1.mlp.c_fc.bias.f32\"
a = np.fromfile(f, dtype=np.float32); a[3] += 1e-3; a.tofile(f)" &&
    ! $PY "$ORACLE" check . 1 2 16 out.txt >check.txt &&
    grep -q "FAIL gradient of h.1.mlp.c_fc.bias" check.txt
'

# ------------------------------------------------------------ the trainer

test_expect_success "gpt2 --prepare tokenizes the shipped corpus into llm.c shards" '
    $GPT2 --prepare "$SRC/examples/gpt2/data/corpus.txt" --out $TMP/corpus >out &&
    grep -q "wrote $TMP/corpus_train.bin and $TMP/corpus_val.bin" out &&
    $PY -c "
import numpy as np, os
for part in (\"train\", \"val\"):
    h = np.fromfile(\"$TMP/corpus_%s.bin\" % part, dtype=np.int32, count=256)
    assert h[0] == 20240520 and h[1] == 1 and h[2] > 1000, h[:3]
    assert os.path.getsize(\"$TMP/corpus_%s.bin\" % part) == 1024 + 2 * h[2]
"
'

test_expect_success "--prepare makes the folders of --out that do not exist; a file in the way is refused, nothing made" '
    $GPT2 --prepare "$SRC/examples/gpt2/data/corpus.txt" --out new/deeper/corpus >out &&
    cmp new/deeper/corpus_train.bin $TMP/corpus_train.bin && cmp new/deeper/corpus_val.bin $TMP/corpus_val.bin &&
    : >file && { $GPT2 --prepare "$SRC/examples/gpt2/data/corpus.txt" --out file/sub/corpus 2>err; rc=$?; } &&
    test $rc -eq 1 && cat err && grep -q "^gpt2: file/sub/corpus_train.bin: file is not a folder" err &&
    test ! -e file/sub && test -f file && test ! -s file &&
    { $GPT2 --prepare /nonexistent.txt --out other/corpus 2>err; rc=$?; } && test $rc -eq 1 && test ! -e other
'

test_expect_success "the tiny GPT-2 trains 2 x 2 on the corpus: the loss falls, val loss (printed and as a scalar) and metrics reported" '
    BMT_PLUGINS=jsonl BMT_JSONL=$PWD/m-%r.jsonl with_timeout 300 $BMLAUNCH --metrics-port 0 -g 2 -n 2 -- \
        $GPT2 --data $TMP/corpus_train.bin --val $TMP/corpus_val.bin --steps 40 --lr 3e-3 \
        --eval-every 20 --eval-batches 2 >out 2>err &&
    grep -q "^0: gpt2: .* params (L 4, H 4, C 64, V 256, maxT 256) | layout 2 x 2 = 4 ranks (shm)" out &&
    test $(grep -c "^0: step  *[0-9]*/40 | loss" out) -eq 40 &&
    test $(grep -c "^0: step  *[0-9]*/40 | val loss" out) -eq 2 &&
    grep -q "^0: step   1/40 | loss [0-9.]* | lr 3.00e-03 | norm [0-9.]* | [0-9.]* ms | [0-9.]*K* tok/s | MFU - | mem [0-9.]* MiB" out &&
    $PY - <<-EOF
	import re, json
	out = open("out").read()
	loss = [float(x) for x in re.findall(r"^0: step +\d+/40 \| loss ([0-9.]+)", out, re.M)]
	val = [float(x) for x in re.findall(r"val loss ([0-9.]+)", out)]
	first, last = sum(loss[:5]) / 5, sum(loss[-5:]) / 5
	assert loss[0] > 5.2 and last < loss[0] - 1.5, (loss[0], last)   # ln 256 = 5.55 at the start
	assert val[-1] < loss[0] - 1.0, val
	rows = [json.loads(l) for l in open("m-0.jsonl")]
	steps = [r for r in rows if r["type"] == "step"]
	assert len(steps) == 40 and steps[0]["tokens"] == 4 * 64 and steps[0]["params"] > 200000
	# each val loss also reaches the plugins, as the scalar val_loss at its step
	vs = [(r["step"], r["value"]) for r in rows if r["type"] == "scalar" and r["name"] == "val_loss"]
	assert [s for s, v in vs] == [20, 40] and all(abs(v - w) < 6e-5 for (s, v), w in zip(vs, val)), (vs, val)
	assert abs(steps[-1]["loss"] - loss[-1]) < 1e-3, (steps[-1]["loss"], loss[-1])
	print("loss %.3f -> %.3f, val %s" % (first, last, val))
	EOF
'

test_expect_success "--init-from loads a safetensors file (sizes from the file) and trains from it" '
    with_timeout 120 $BMLAUNCH --metrics-port 0 -g 1 -n 2 -- $GPT2 --init-from $TMP/model.safetensors \
        --heads 4 --data $TMP/data.bin -b 2 -t 16 --steps 3 --gemm-tune 4 >out 2>err &&
    grep -q "^0: gpt2: .* params (L 2, H 4, C 32, V 67, maxT 24)" out &&
    test $(grep -c "^0: step  *[0-9]/3 | loss" out) -eq 3
'

test_expect_success "--init-from with a size that disagrees with the file is refused, naming both (one that repeats it is taken)" '
    for a in "--layers 1:has 2 layers (h.<N>) but --layers is 1" "--embd 64:has 32 n_embd but --embd is 64" \
             "--vocab 80:has 67 vocab_size but --vocab is 80" "--max-seq 16:has 24 positions (wpe) but --max-seq is 16"; do
        { $GPT2 --init-from $TMP/model.safetensors --heads 4 ${a%%:*} --data $TMP/data.bin -t 8 >out 2>&1; rc=$?; }
        test $rc -eq 2 && grep -q "^gpt2: $TMP/model.safetensors ${a#*:}: with --init-from the sizes are the file.s; leave ${a%% *} out" out ||
            { echo "${a%%:*}: exit $rc"; cat out; return 1; }
    done &&
    with_timeout 60 $BMLAUNCH --metrics-port 0 -n 1 -- $GPT2 --init-from $TMP/model.safetensors --heads 4 \
        --layers 2 --embd 32 --vocab 67 --max-seq 24 --data $TMP/data.bin -b 2 -t 16 --steps 1 >out 2>&1 &&
    grep -q "^0: gpt2: .* params (L 2, H 4, C 32, V 67, maxT 24)" out
'

test_expect_success "a file that does not fit the model is refused, naming the file and tensor" '
    $PY - <<-EOF &&
	import sys; sys.path.insert(0, "$SRC/tests/tools")
	import gpt2_oracle as o, numpy as np
	t = o.read_safetensors("$TMP/model.safetensors")
	t["h.1.mlp.c_fc.weight"] = t["h.1.mlp.c_fc.weight"][:, :100]
	o.write_safetensors("bad_shape.safetensors", t)
	t = o.read_safetensors("$TMP/model.safetensors"); del t["ln_f.bias"]
	o.write_safetensors("missing.safetensors", t)
	EOF
    { with_timeout 60 $BMLAUNCH --metrics-port 0 -n 1 -- $GPT2 --init-from bad_shape.safetensors \
        --heads 4 --data $TMP/data.bin -b 2 -t 16 --steps 1 >out 2>&1; rc=$?; } &&
    test $rc -ne 0 && grep -q "bad_shape.safetensors.*h.1.mlp.c_fc.weight" out &&
    { with_timeout 60 $BMLAUNCH --metrics-port 0 -n 1 -- $GPT2 --init-from missing.safetensors \
        --heads 4 --data $TMP/data.bin -b 2 -t 16 --steps 1 >out 2>&1; rc=$?; } &&
    test $rc -ne 0 && grep -q "missing.safetensors has no tensor .transformer.ln_f.bias. (nor .ln_f.bias.)" out
'

test_expect_success "--init-from a file holding a nan or an inf is refused, naming the tensor and element (exit 1, nothing trained)" '
    $PY - <<-EOF &&
	import sys; sys.path.insert(0, "$SRC/tests/tools")
	import gpt2_oracle as o, numpy as np
	t = o.read_safetensors("$TMP/model.safetensors")
	t["h.1.attn.c_proj.weight"] = t["h.1.attn.c_proj.weight"].copy(); t["h.1.attn.c_proj.weight"].flat[37] = np.nan
	o.write_safetensors("nan.safetensors", t)
	t = o.read_safetensors("$TMP/model.safetensors")
	t["ln_f.bias"] = t["ln_f.bias"].copy(); t["ln_f.bias"][5] = -np.inf
	o.write_safetensors("inf.safetensors", t)
	EOF
    for f in "nan:transformer.h.1.attn.c_proj.weight: element 37 is nan" "inf:transformer.ln_f.bias: element 5 is -inf"; do
        rc=0
        with_timeout 60 $BMLAUNCH --metrics-port 0 -g 1 -n 2 -- $GPT2 --init-from ${f%%:*}.safetensors \
            --heads 4 --data $TMP/data.bin -b 2 -t 16 --steps 1 >out 2>&1 || rc=$?
        test $rc -ne 0 && grep -q "loading ${f#*:}: parameters must be finite" out &&
            ! grep -q "step  *1/1 | loss" out || { echo "$f: exit $rc"; cat out; exit 1; }
    done
'

test_expect_success "bad arguments exit 2 with what is wrong" '
    for args in "--steps x" "--steps 0" "--model d99" "--zero 1" "--heads 5 --embd 64" "--seq 300" \
                "--lr -1" "--bogus" "--prepare x" "--gemm-tune 33" "--gemm-tune -1" \
                "--overlap-step 2" "--keep-attention -1" "--fp8 2" "--fp8 1 --fp8-scaling sometimes" \
                "--fp8 1 --fp8-history 0" "--fp8 1 --fp8-history 1025" "--fp8-scaling current" "--fp8 0 --fp8-history 4" \
                "--fp8 1 --fp8-scaling current --fp8-history 4"; do
        { $GPT2 --data $TMP/corpus_train.bin $args >out 2>&1; rc=$?; }
        test $rc -eq 2 || { echo "$args: exit $rc"; cat out; exit 1; }
        grep -q "^gpt2: " out || { echo "$args:"; cat out; exit 1; }
    done &&
    { $GPT2 --steps 1 >out 2>&1; rc=$?; } && test $rc -eq 2 && grep -q "data PATTERN is required" out &&
    { $GPT2 --data $TMP/corpus_train.bin --seed " 1" >out 2>&1; rc=$?; } && test $rc -eq 2 &&
    grep -q "^gpt2: --seed needs a non-negative integer, not . 1.$" out &&
    { $GPT2 --data $TMP/corpus_train.bin --save-dir "" >out 2>&1; rc=$?; } && test $rc -eq 2 &&
    grep -q "^gpt2: --save-dir needs a directory name$" out
'

test_expect_success "the optimizer's update in the step or under the next forward: the same losses and norms (cpu, 1x2)" '
    for ov in 0 1; do
        with_timeout 120 $BMLAUNCH --metrics-port 0 -n 2 -- $GPT2 --model tiny \
            --data $TMP/corpus_train.bin -b 2 -t 32 --steps 6 --overlap-step $ov >out.$ov 2>&1 ||
            { cat out.$ov; exit 1; }
        grep -o "step *[0-9]*/6 | loss [0-9.]* | lr [0-9.e+-]* | norm [0-9.]*" out.$ov >steps.$ov
    done &&
    test $(wc -l <steps.1) -eq 6 && cmp steps.0 steps.1
'

# Selective checkpointing (--ckpt-budget): the last layer keeps its
# activations, the others are recomputed: the tensors of a step directory bit
# for bit those of --ckpt 1 and --ckpt 0, the activations' peak between.
test_expect_success "--ckpt-budget (2x2): layer 3 keeps its activations; the same tensors bit for bit as --ckpt 1 and --ckpt 0, the activations' peak between" '
    for run in all:1 sel:"1 --ckpt-budget 2" none:0; do
        with_timeout 120 $BMLAUNCH --metrics-port 0 -g 2 -n 2 -- $GPT2 --model tiny \
            --data $TMP/corpus_train.bin -b 4 -t 64 --steps 4 --ckpt ${run#*:} \
            --save-dir $TMP/sel-${run%%:*} >$TMP/sel-${run%%:*}.out 2>err || { tail -5 err; return 1; }
    done &&
    grep "checkpointing within" $TMP/sel-sel.out &&
    grep -q "^0: gpt2: checkpointing within 2.0 MiB: layers 3..3 keep their activations (1 x 1.4 MiB), layers 0..2 are recomputed; the head keeps its logits (nothing to recompute)\$" $TMP/sel-sel.out &&
    n=0 && for f in $TMP/sel-all/step-00000004/*.safetensors; do
        cmp $f $TMP/sel-sel/step-00000004/${f##*/} && cmp $f $TMP/sel-none/step-00000004/${f##*/} &&
        n=$((n + 1)) || return 1
    done && echo "$n files the same" && test $n -eq 10 &&
    peak() { sed -n "s/^0: gpt2: peak memory by kind (MiB): .*activation \([0-9.]*\),.*/\1/p" "$1"; } &&
    a1=$(peak $TMP/sel-all.out) && ab=$(peak $TMP/sel-sel.out) && a0=$(peak $TMP/sel-none.out) &&
    echo "activation peaks: every layer recomputed $a1, 1 of 4 kept $ab, none recomputed $a0 MiB" &&
    awk -v a=$a1 -v b=$ab -v c=$a0 "BEGIN { exit !(a < b && b < c) }"
'

# keep_check: what the budget counts per kept layer (gpt2_model_act_bytes) is
# what keeping a layer holds, byte for byte, after a forward.
test_expect_success "--ckpt-budget's arithmetic: each kept layer holds act_bytes' layer exactly (keep_check, cpu)" '
    with_timeout 120 "$BMLAUNCH" --metrics-port 0 -n 1 -- "$PROGS/keep_check" --model gpt2 >out 2>err &&
    grep -q "^0: keep_check: 5 passed, 0 failed" out &&
    grep -q "^0: ok 3 - gpt2: 3 of 4 layers kept hold 3 x act_bytes. layer more: [1-9][0-9]* bytes" out
'

test_expect_success "--keep-attention on the cpu model is refused, saying it is for cuda" '
    { with_timeout 60 $BMLAUNCH --metrics-port 0 -n 1 -- $GPT2 --model tiny \
        --data $TMP/corpus_train.bin -b 2 -t 32 --steps 1 --keep-attention 1 >out 2>&1; rc=$?; } &&
    test $rc -ne 0 && grep -q "keeping the attention outputs .* is for the cuda model (--device cuda)" out
'

# --fp8 1 on the cpu: the layers' four products with their operands through
# FP8 (nn/fp8.h, checked op by op against the formats' definitions in
# test_fp8): close to the f32 run from the same seed, but not the same; with
# delayed scaling (the default) and with current scaling, which share their
# first step (the first pass is current) and then part.
test_expect_success "--fp8 1 (cpu, 2x2), delayed and current scaling: 20 steps within 1% of the f32 run, not equal to it; the loss falls" '
    for f in "0" "1 --fp8-scaling current" "1"; do
        with_timeout 300 $BMLAUNCH --metrics-port 0 -g 2 -n 2 -- $GPT2 --data $TMP/corpus_train.bin \
            --steps 20 --lr 3e-3 --seed 7 --fp8 $f >"out.$f" 2>&1 || { cat "out.$f"; exit 1; }
    done &&
    grep -q "^0: gpt2: rank 0: fp8: delayed scaling over 16 passes; 20 passes; [0-9]* operand-passes saturated, 0 unscalable" out.1 &&
    grep -q "^0: gpt2: rank 0: fp8: current scaling; 20 passes; 0 operand-passes saturated, 0 unscalable" "out.1 --fp8-scaling current" &&
    ! grep -q "fp8:" out.0 &&
    $PY - <<-EOF
	import re
	runs = ("0", "1 --fp8-scaling current", "1")
	loss = [[float(x) for x in re.findall(r"^0: step +\d+/20 \| loss ([0-9.]+)", open("out." + f).read(), re.M)] for f in runs]
	assert all(len(l) == 20 for l in loss), loss
	for fp8 in loss[1:]:
	    rel = [abs(a - b) / a for a, b in zip(loss[0], fp8)]
	    assert max(rel) < 0.01, max(rel)
	    assert loss[0] != fp8, "the same losses: FP8 not applied"
	    assert sum(fp8[-5:]) / 5 < fp8[0] - 1.0, fp8
	    print("f32 %.4f -> %.4f, fp8 %.4f -> %.4f, largest step difference %.2g" % (loss[0][0], loss[0][-1], fp8[0], fp8[-1], max(rel)))
	assert loss[1][0] == loss[2][0] and loss[1] != loss[2], "delayed: the first step current, then its own"
	EOF
'

test_expect_success "--fp8 1 with a NaN planted in the parameters: its steps are skipped as without FP8, --max-skipped stops the run" '
    { BMT_FAULT=nan:0:2 with_timeout 120 $BMLAUNCH --metrics-port 0 -n 2 -- $GPT2 \
        --data $TMP/corpus_train.bin --steps 8 --fp8 1 --max-skipped 2 >out 2>err; rc=$?; } &&
    test $rc -ne 0 && test $(grep -c "^0: step   [34]/8 | loss nan .*(skipped)" out) -eq 2 &&
    grep "^bmlaunch: job failed" err | grep -q "3 optimizer steps in a row were skipped (gradient norm nan, not finite), more than max_skipped 2"
'

# Options that change nothing without another, or not what they say, are
# refused before anything runs: each of these used to train (exit 0) as if it
# had not been given.
test_expect_success "an option that needs another (--val, --save-dir, --prepare, a step after the warm-up) is refused without it, exit 2" '
    for a in "--eval-every 5:--eval-every sets the validation, which needs --val PATTERN" \
             "--eval-batches 2:--eval-batches sets the validation, which needs --val PATTERN" \
             "--keep 2:--save-every, --save-async, --keep and --resume need --save-dir DIR" \
             "--out ck:--out is --prepare.s (the shards it writes): it needs --prepare TEXT; checkpoints go to --save-dir DIR" \
             "--val-fraction 0.2:--val-fraction is --prepare.s" \
             "--verify ck --prepare t --out p:--verify and --prepare are two runs of their own: give one" \
             "--warmup 10 --steps 10 --lr-min-frac 0.1:--lr-min-frac 0.1 decays the learning rate over the steps after the warm-up, and --warmup 10 leaves none of --steps 10" \
             "--steps 5 --warmup 8 --lr-min-frac 0:--lr-min-frac 0 decays .* --warmup 8 leaves none of --steps 5"; do
        for prog in $GPT2 $BUILDDIR/bin/llama; do
            n=${prog##*/}
            { $prog --data $TMP/corpus_train.bin ${a%%:*} >out 2>&1; rc=$?; } &&
                test $rc -eq 2 && grep -q "^$n: ${a#*:}" out && ! grep -q "params" out ||
                { echo "$n ${a%%:*}: exit $rc"; cat out; return 1; }
        done
    done
'

# lr_at against the formula of docs/gpt2.md, computed here: step s <= N at
# s/N LR, then LR (F + (1 - F)(1 + cos(pi (s - N)/(S - N)))/2); a warm-up one
# step shorter than the run still ends at F x LR; a resume in the decay goes on
# with the same rates. And tokens/s is the job's tokens (B T A x ranks) over
# the step time printed beside it.
test_expect_success "the printed learning rate is the documented schedule (warm-up, cosine to F x LR at the last step; after a resume too); tok/s is B T A ranks / step time" '
    test -f $TMP/corpus_train.bin || $GPT2 --prepare "$SRC/examples/gpt2/data/corpus.txt" --out $TMP/corpus >/dev/null &&
    with_timeout 120 $BMLAUNCH --metrics-port 0 -n 2 -- $GPT2 --data $TMP/corpus_train.bin -b 1 -t 16 -a 3 \
        --steps 12 --lr 1e-2 --warmup 4 --lr-min-frac 0.1 --save-dir ck --save-every 6 >a.out 2>&1 &&
    with_timeout 60 $BMLAUNCH --metrics-port 0 -n 1 -- $GPT2 --data $TMP/corpus_train.bin -b 1 -t 16 \
        --steps 5 --lr 1e-2 --warmup 4 --lr-min-frac 0.25 >b.out 2>&1 &&
    mkdir rs && cp -r ck/step-00000006 rs/ && printf step-00000006 >rs/latest &&
    with_timeout 120 $BMLAUNCH --metrics-port 0 -n 2 -- $GPT2 --data $TMP/corpus_train.bin -b 1 -t 16 -a 3 \
        --steps 12 --lr 1e-2 --warmup 4 --lr-min-frac 0.1 --save-dir rs --resume >r.out 2>&1 &&
    $PY - <<-EOF
	import math, re
	def steps(f):
	    return [(int(s), float(lr), float(ms), t) for s, lr, ms, t in re.findall(
	        r"^0: step +(\d+)/\d+ \| loss [0-9.]+ \| lr ([0-9.e+-]+) \| norm [0-9.]+ \| ([0-9.]+) ms \| ([0-9.]+K?) tok/s", open(f).read(), re.M)]
	def lr(s, N, S, F, LR=1e-2):
	    if s <= N:
	        return LR * s / N
	    return LR * (F + (1 - F) * (1 + math.cos(math.pi * (s - N) / (S - N))) / 2)
	for f, S, F, first in (("a.out", 12, 0.1, 1), ("b.out", 5, 0.25, 1), ("r.out", 12, 0.1, 7)):
	    got = steps(f)
	    assert [s for s, *_ in got] == list(range(first, S + 1)), (f, got)
	    for s, printed, ms, tps in got:
	        want = lr(s, 4, S, F)
	        assert abs(printed - float("%.2e" % want)) <= 1e-12, (f, s, printed, want)
	    assert abs(got[-1][1] - F * 1e-2) < 1e-12, (f, "the last step is not at F x LR", got[-1])
	for s, printed, ms, tps in steps("a.out"):  # 1 x 16 x 3 x 2 ranks = 96 tokens a step
	    v, half = (float(tps[:-1]) * 1e3, 50) if tps.endswith("K") else (float(tps), 0.5)
	    lo, hi = 96e3 / (ms + 0.05), 96e3 / (ms - 0.05)  # the printed figures are rounded
	    assert v - half <= hi and v + half >= lo, (s, tps, ms, lo, hi)
	print("schedule and tok/s as documented:", [p for _, p, _, _ in steps("a.out")])
	EOF
'

# --model with --init-from: the file decides the model, so a preset of other
# sizes would have been trained as the file's model without a word.
test_expect_success "--init-from with --model: the file's own preset is taken, another is refused naming both (exit 2)" '
    test -f $TMP/corpus_train.bin || $GPT2 --prepare "$SRC/examples/gpt2/data/corpus.txt" --out $TMP/corpus >/dev/null &&
    with_timeout 60 $BMLAUNCH --metrics-port 0 -n 1 -- $GPT2 --data $TMP/corpus_train.bin -b 1 -t 16 --steps 1 \
        --save-dir t >out 2>&1 &&
    { $GPT2 --model d12 --init-from t/step-00000001 --data $TMP/corpus_train.bin >out 2>&1; rc=$?; } &&
    test $rc -eq 2 && cat out &&
    grep -q "^gpt2: --model d12 is L 12, H 12, C 768, V 50257, maxT 1024, but t/step-00000001 holds L 4, H 4, C 64, V 256, maxT 256: with --init-from the model is the file.s; leave --model out or name the file.s" out &&
    { $GPT2 --model d99 --init-from t/step-00000001 --data $TMP/corpus_train.bin >out 2>&1; rc=$?; } &&
    test $rc -eq 2 && grep -q "^gpt2: unknown model .d99." out &&
    with_timeout 60 $BMLAUNCH --metrics-port 0 -n 1 -- $GPT2 --model tiny --init-from t/step-00000001 \
        --data $TMP/corpus_train.bin -b 1 -t 16 --steps 1 >out 2>&1 &&
    grep -q "^0: gpt2: .* params (L 4, H 4, C 64, V 256, maxT 256)" out
'

test_expect_success "a missing data file fails the job with the file named" '
    { with_timeout 60 $BMLAUNCH --metrics-port 0 -n 2 -- $GPT2 --data nosuch.bin --steps 1 >out 2>&1; rc=$?; } &&
    test $rc -ne 0 && grep -q "nosuch.bin" out
'

test_done
