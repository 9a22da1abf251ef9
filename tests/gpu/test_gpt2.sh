#!/bin/bash
# GPU tests of the GPT-2 example's CUDA path (make check-gpu, >= 1 GPU; the
# layouts 1x2 and 2x1 need 2, 1x4 2x2 4x1 need 4, 1x8 2x4 4x2 8x1 need 8):
# - HF transformers' GPT2LMHeadModel as the oracle (tests/gpu/gpt2_hf.py, f32 on
#   the GPU, no TF32) with the same bf16-representable weights: logits, loss,
#   every gradient and the gradient norm of the first step, and the loss curve
#   over 50 AdamW steps, bf16 bounds (in gpt2_hf.py);
# - the trainer on cuda through bmlaunch: the loss falls, MFU is reported;
# - its checkpoint directory is HF-loadable as written: transformers'
#   GPT2LMHeadModel.from_pretrained(step dir), unchanged, with no warning, gives
#   the trainer's loss (gpt2_hf.py pretrained);
# - fresh gradients filled with NaN before the callbacks write them
#   (BMT_CHECK_OVERWRITE=1): the same tensors bit for bit as without.
# GPT2_CURVES=DIR keeps each layout's loss curves (ours, HF) there (made if missing).
. "$(dirname "$0")/../integration/lib.sh"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} BMT_TIMEOUT=120
# Every run fills the gradients that the CUDA model overwrites with NaN first
# (docs/engine.md#fresh-gradients): a kernel that read one would show in the
# oracles' bounds as well as in the bit-for-bit test below that sets it itself.
export BMT_CHECK_OVERWRITE=${BMT_CHECK_OVERWRITE:-1}
gpu_require 1
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')

PY=python3
HF=$SRC/tests/gpu/gpt2_hf.py
GPT2=$BUILDDIR/bin/gpt2
CURVES=${GPT2_CURVES:-$TMP}
mkdir -p "$CURVES" || { echo "test_gpt2.sh: GPT2_CURVES=$CURVES: cannot make that folder; name a writable one" >&2; exit 1; }
L=4 C=256 NH=4 V=50257 MAXT=256 B=4 T=256

$GPT2 --prepare "$SRC/examples/gpt2/data/corpus.txt" --out "$TMP/corpus" >/dev/null &&
    cp "$TMP/corpus_train.bin" "$TMP/data.bin" &&
    $PY "$HF" make "$TMP" $L $C $NH $V $MAXT || echo "# the oracle could not make its files"

# hf LAYOUT: gpt2_check on cuda in that layout, then the oracle
hf() {
    local g=${1%x*} n=${1#*x} rc=0 tag=$1
    [ $# -gt 1 ] && tag=$1$(echo " ${@:2}" | sed 's/ --*/-/g; s/ /-/g') # 1x2-zero-2-ckpt-0
    cp "$TMP/model.safetensors" "$TMP/data.bin" "$TMP/shape.json" .
    with_timeout 600 "$BMLAUNCH" --metrics-port 0 --device cuda -g $g -n $n -- \
        "$PROGS/gpt2_check" --init model.safetensors --data data.bin --heads $NH -b $B -t $T \
        --out . --steps 50 "${@:2}" >out 2>err || rc=$?
    [ $rc -eq 0 ] || { echo "gpt2_check exit $rc"; tail -5 err; return 1; }
    sed 's/^0: //' out >out.txt
    $PY "$HF" check "$PWD" $((g * n)) $B $T out.txt "$CURVES/curve-$tag.txt"
}

layouts="1x1"
[ "$gpus" -ge 2 ] && layouts="1x1 1x2 2x1"
[ "$gpus" -ge 4 ] && layouts+=" 1x4 2x2 4x1"
[ "$gpus" -ge 8 ] && layouts+=" 1x8 2x4 4x2 8x1"
# The oracle's figures (errors, curves) go to the log as comments, pass or fail.
figures() { [ -f "$TMP/check-$1.txt" ] && sed 's/^/# /' "$TMP/check-$1.txt"; }
for layout in $layouts; do
    test_expect_success "GPT-2 (L $L, C $C, V $V) on cuda $layout against HF GPT2LMHeadModel: logits, loss, gradients, 50 steps" "
        hf $layout >check.txt; rc=\$?; cp check.txt \$TMP/check-$layout.txt; cat check.txt
        test \$rc -eq 0 && test \$(grep -c '^ok ' check.txt) -eq 7
    "
    figures $layout
done

test_expect_success "the same with zero level 2 and no activation checkpointing (1x$([ "$gpus" -ge 2 ] && echo 2 || echo 1))" "
    hf 1x$([ "$gpus" -ge 2 ] && echo 2 || echo 1) --zero 2 --ckpt 0 >check.txt; rc=\$?; cat check.txt; test \$rc -eq 0
"

test_expect_success "the same with each layer's attention recomputed under checkpointing, not kept (1x1)" "
    hf 1x1 --keep-attention 0 >check.txt; rc=\$?; cat check.txt; test \$rc -eq 0 && test \$(grep -c '^ok ' check.txt) -eq 7
"

# The trainer writes config.json beside its bf16 files (gpt2_hf_config_json);
# transformers reads the directory with nothing added, renamed or converted, and
# the trainer reads it back with the heads from it (no --heads).
test_expect_success "a checkpoint of the trainer on cuda loads in transformers as written: from_pretrained(step dir), no warning, the trainer's loss" '
    with_timeout 300 "$BMLAUNCH" --metrics-port 0 --device cuda -n 1 -- "$GPT2" \
        --init-from "$TMP/model.safetensors" --heads $NH --data "$TMP/data.bin" -b $B -t $T \
        --steps 2 --save-dir S >out 2>&1 || { tail -20 out; false; } &&
    step=S/$(cat S/latest) &&
    { test -f $step/config.json ||
      { echo "FAIL $step has no config.json: the trainer does not write one (bmt_ckpt_save)"; false; }; } &&
    cat $step/config.json &&
    with_timeout 300 "$BMLAUNCH" --metrics-port 0 --device cuda -n 1 -- "$GPT2" --init-from $step \
        --data "$TMP/data.bin" -b $B -t $T --steps 1 >out2 2>&1 || { tail -20 out2; false; } &&
    grep -q "^0: gpt2: .* params (L $L, H $NH, C $C, V $V, maxT $MAXT)" out2 &&
    loss=$(sed -n "s/^0: step *1\/1 | loss \([0-9.]*\).*/\1/p" out2) && test -n "$loss" &&
    rc=0 && { $PY "$HF" pretrained $step "$TMP/data.bin" $B $T $loss >check.txt || rc=$?; } &&
    cat check.txt && test $rc -eq 0 && test $(grep -c "^ok " check.txt) -eq 6
'

# In every layout: the deferred update runs on the replica stream inside the
# next forward and its sums of squares in the backward (comm stream in a group,
# replica stream across groups); none of it may change a bit of the result.
for layout in $layouts; do
    g=${layout%x*} n=${layout#*x}
    test_expect_success "the trainer on cuda $layout: attention kept or recomputed, update deferred or not: the same losses and norms" "
        for v in '0 1' '1 1' '0 0'; do
            set -- \$v
            with_timeout 300 \"\$BMLAUNCH\" --metrics-port 0 --device cuda -g $g -n $n -- \"\$GPT2\" --model tiny \\
                --data \"\$TMP/corpus_train.bin\" -b 8 -t 256 --steps 8 --keep-attention \$1 \\
                --overlap-step \$2 >out.\$1\$2 2>&1 || { tail -20 out.\$1\$2; exit 1; }
            grep -o '^0: step *[0-9]*/8 | loss [0-9.]* | lr [0-9.e+-]* | norm [0-9.]*' out.\$1\$2 >steps.\$1\$2
        done &&
        test \$(wc -l <steps.01) -eq 8 && cmp steps.01 steps.11 && cmp steps.01 steps.00
    "
done

# Selective checkpointing on cuda (--ckpt-budget), bf16 and FP8: a run whose
# budget keeps every layer and the head's whole logits has --ckpt 0's tensors
# bit for bit, one that keeps layers 2..3 --ckpt 1's (their kept sets hold
# what a recomputation would make again: with FP8 the same codes, and the
# mlp.c_proj weight's codes from the forward); the activations' peak between.
test_expect_success "--ckpt-budget on cuda, bf16 and --fp8 1: layers 2..3 kept: --ckpt 1's tensors bit for bit; every layer and the head kept: --ckpt 0's" '
    for fp8 in 0 1; do
        sel() { # TAG CKPT-OPTIONS...
            with_timeout 300 "$BMLAUNCH" --metrics-port 0 --device cuda -n 1 -- "$GPT2" --model tiny \
                --data "$TMP/corpus_train.bin" -b 8 -t 128 --steps 4 --fp8 $fp8 --ckpt "${@:2}" \
                --save-dir $TMP/sel$fp8-$1 >$TMP/sel$fp8-$1.out 2>&1 || { tail -20 $TMP/sel$fp8-$1.out; return 1; }
        }
        sel full 1 --ckpt-budget 100000 && sel all 1 && sel none 0 &&
        grep "checkpointing within" $TMP/sel$fp8-full.out &&
        x=$(sed -n "s/^0: gpt2: checkpointing within .*: every layer keeps its activations (4 x \([0-9.]*\) MiB); the head keeps its logits whole\$/\1/p" $TMP/sel$fp8-full.out) &&
        test -n "$x" && sel sel 1 --ckpt-budget $(awk -v x=$x "BEGIN { print 2.5 * x }") &&
        grep "checkpointing within" $TMP/sel$fp8-sel.out &&
        grep -q "^0: gpt2: checkpointing within .*: layers 2..3 keep their activations (2 x $x MiB), layers 0..1 are recomputed; the head recomputes its logits chunk by chunk\$" $TMP/sel$fp8-sel.out &&
        n=0 && for f in $TMP/sel$fp8-all/step-00000004/*.safetensors; do
            g=${f##*/} && cmp $f $TMP/sel$fp8-sel/step-00000004/$g &&
            cmp $TMP/sel$fp8-none/step-00000004/$g $TMP/sel$fp8-full/step-00000004/$g && n=$((n + 1)) || return 1
        done && echo "fp8 $fp8: $n files the same" && test $n -eq 10 &&
        peak() { sed -n "s/^0: gpt2: peak memory by kind (MiB): .*activation \([0-9.]*\),.*/\1/p" "$1"; } &&
        a1=$(peak $TMP/sel$fp8-all.out) && ab=$(peak $TMP/sel$fp8-sel.out) && a0=$(peak $TMP/sel$fp8-none.out) &&
        echo "fp8 $fp8: activation peaks (MiB): every layer recomputed $a1, 2 of 4 kept $ab, none $a0" &&
        awk -v a=$a1 -v b=$ab -v c=$a0 "BEGIN { exit !(a < b && b < c) }" || return 1
    done
'

# Fresh gradients are the CUDA model's to write (bmt_blocklist_set_grad_overwrite):
# the list does not zero them. Under BMT_CHECK_OVERWRITE=1 it fills them with
# NaN first, so a kernel that added into one, or left an element unwritten
# (wpe's in the head's use of the tied block), would give NaN there and other
# tensors than the run without it. bf16 and --fp8 1, two micro-batches,
# checkpointing on and off.
test_expect_success "fresh gradients NaN-filled first (BMT_CHECK_OVERWRITE=1), bf16 and --fp8 1: the same tensors bit for bit, 2 micro-batches, checkpointing on and off" '
    for fp8 in 0 1; do for ck in 0 1; do
        for poison in 0 1; do
            BMT_CHECK_OVERWRITE=$poison with_timeout 300 "$BMLAUNCH" --metrics-port 0 --device cuda -n 1 -- \
                "$GPT2" --model tiny --data "$TMP/corpus_train.bin" -b 8 -t 128 -a 2 --steps 4 --fp8 $fp8 \
                --ckpt $ck --save-dir $TMP/ow$fp8$ck$poison >$TMP/ow$fp8$ck$poison.out 2>&1 ||
                { tail -20 $TMP/ow$fp8$ck$poison.out; return 1; }
        done &&
        ! grep -qi "skipped\|norm -\{0,1\}nan" $TMP/ow$fp8${ck}1.out &&
        n=0 && for f in $TMP/ow$fp8${ck}0/step-00000004/*.safetensors; do
            cmp $f $TMP/ow$fp8${ck}1/step-00000004/${f##*/} && n=$((n + 1)) || return 1
        done && echo "fp8 $fp8, ckpt $ck: $n files the same" && test $n -eq 10 || return 1
    done; done
'

test_expect_success "--ckpt-budget's arithmetic on cuda, bf16 and --fp8 1, attention kept or not: each kept layer holds gpt2_cu_act_bytes' layer exactly, the whole logits at least its head (keep_check)" '
    for fp8 in 0 1; do for ka in 0 1; do
        with_timeout 120 "$BMLAUNCH" --metrics-port 0 --device cuda -n 1 -- "$PROGS/keep_check" --model gpt2 \
            --fp8 $fp8 --keep-attention $ka >out 2>err || { cat out err; return 1; }
        cat out && grep -q "^0: keep_check: 5 passed, 0 failed" out || return 1
    done; done
'

# --fp8 1 on cuda (nn_cuda_fp8_conv1d_*, checked op by op against the cpu's
# emulation in test_fp8) against --fp8 1 on the cpu, from the same
# bf16-representable weights, at delayed and at current scaling: over the
# first 16 steps the GPU's FP8 run may differ from its emulation no more than
# its bf16 run differs from the cpu's f32 run (the two differ only by bf16
# activations and the order of sums), with slack; and it differs from the
# GPU's bf16 run, so FP8 is on. At this learning rate every run, f32 too,
# meets an instability at step 17 or 18, and which of the two spikes is
# chance: the last steps are printed, not bounded (on an H200: cuda bf16 /
# cpu f32 4.4% at one step there; 0.024% over steps 1-16, FP8 delayed against
# its emulation 0.072%, current 0.22%). Delayed scaling's first step runs at
# current scaling: the same loss as the current run, then its own. Under
# checkpointing, a layer's recomputation makes the same codes whether it runs
# the attention again or kept its output: the same losses, bit for bit; the
# first step's loss is the same as without checkpointing and the first five
# within 0.2% (checkpointing moves the last bits, FP8 or not: the head runs in
# chunks, other shapes for cuBLASLt; with current scaling the first five steps
# printed the same, while delayed scaling carries each step's amax into the
# next steps' scales: on an H200 the fourth step's norm differed, the losses
# by 2.1e-5).
mkdir -p "$TMP/fp8" && $PY "$HF" make "$TMP/fp8" 4 64 4 256 256 || echo "# the oracle could not make the FP8 test's weights"
fp8run() { # DEVICE FP8 TAG [options]: 20 steps of the tiny shape
    with_timeout 300 "$BMLAUNCH" --metrics-port 0 --device $1 -n 1 -- "$GPT2" \
        --init-from "$TMP/fp8/model.safetensors" --heads 4 --data "$TMP/corpus_train.bin" \
        -b 8 -t 128 --steps 20 --lr 3e-3 --warmup 2 --fp8 $2 "${@:4}" >out.$3 2>&1 || { tail -20 out.$3; return 1; }
    grep -o "^0: step *[0-9]*/20 | loss [0-9.]* | lr [0-9.e+-]* | norm [0-9.]*" out.$3 >steps.$3
    test $(wc -l <steps.$3) -eq 20 || { echo "out.$3: not 20 steps"; tail -5 out.$3; return 1; }
}
test_expect_success "--fp8 1 on cuda, delayed and current scaling: the cpu emulation's losses as closely as bf16 follows f32, not the bf16 run's; recomputed or kept attention give the same bits; the scaling's counts printed" '
    fp8run cpu 0 cpu32 && fp8run cpu 1 cpu8 && fp8run cuda 0 bf16 --ckpt 0 &&
    fp8run cuda 1 fp8 --ckpt 0 && fp8run cuda 1 fp8ck --ckpt 1 --keep-attention 0 &&
    fp8run cuda 1 fp8ka --ckpt 1 --keep-attention 1 && cmp steps.fp8ck steps.fp8ka &&
    fp8run cpu "1 --fp8-scaling current" cpu8c && fp8run cuda "1 --fp8-scaling current" fp8c --ckpt 0 &&
    for t in cpu8 fp8 fp8ck; do
        grep "^0: gpt2: rank 0: fp8: delayed scaling over 16 passes; 20 passes; [0-9]* operand-passes saturated, 0 unscalable" out.$t || exit 1
    done &&
    grep "^0: gpt2: rank 0: fp8: current scaling; 20 passes; 0 operand-passes saturated, 0 unscalable" out.fp8c &&
    $PY - <<-EOF | tee -a "$TMP/figures-fp8.txt"; test ${PIPESTATUS[0]} -eq 0
	import re
	def losses(t): return [float(x) for x in re.findall(r"loss ([0-9.]+)", open("steps." + t).read())]
	c32, c8, b16, f8, f8ck, c8c, f8c = (losses(t) for t in ("cpu32", "cpu8", "bf16", "fp8", "fp8ck", "cpu8c", "fp8c"))
	def d(a, b): return max(abs(x - y) / y for x, y in zip(a, b))
	# Bounded over the first 16 steps: at this learning rate every run, f32
	# included, meets an instability near step 17 or 18 and which of the two
	# steps spikes is chance (the figures of all 20 steps are printed)
	K = 16
	ref, emu, emuc, vs16, ck = d(b16[:K], c32[:K]), d(f8[:K], c8[:K]), d(f8c[:K], c8c[:K]), d(f8, b16), d(f8ck, f8)
	ck5 = d(f8ck[:5], f8[:5])
	for name, l in (("cpu f32", c32), ("cpu fp8", c8), ("cpu fp8 cur", c8c), ("cuda bf16", b16), ("cuda fp8", f8), ("cuda fp8 cur", f8c), ("cuda fp8 ckpt", f8ck)):
	    print("# %-13s %s" % (name, " ".join("%.4f" % x for x in l)))
	print("# largest step difference: steps 1-16: cuda bf16 / cpu f32 %.3g; cuda fp8 / cpu fp8 %.3g (delayed), %.3g (current); all 20: cuda bf16 / cpu f32 %.3g, cuda fp8 / cpu fp8 %.3g (delayed), %.3g (current), cuda fp8 / cuda bf16 %.3g; checkpointing / not %.3g (%.3g in the first five steps)" % (ref, emu, emuc, d(b16, c32), d(f8, c8), d(f8c, c8c), vs16, ck, ck5))
	assert emu <= 2 * ref + 0.005, "cuda fp8 (delayed) strays from its emulation"
	assert emuc <= 2 * ref + 0.005, "cuda fp8 (current) strays from its emulation"
	assert f8 != b16 and f8c != b16, "cuda fp8 gives the bf16 losses: FP8 not applied"
	assert f8[0] == f8c[0] and f8 != f8c, "delayed: the first step at current scaling, then its own"
	assert f8[0] == f8ck[0] and ck5 <= 2e-3, "checkpointing moves the first FP8 steps more than bf16 rounding"
	assert sum(f8[-5:]) / 5 < f8[0] - 1.0, "the loss does not fall"
	EOF
'

# At a gentler learning rate the runs do not part: FP8 follows bf16 within 2%
# at every one of the 20 steps (the issue's bar for 500 steps of real text is
# 1%; bench/gpu/fp8.sh measures that on d48).
test_expect_success "--fp8 1 on cuda at lr 1e-3: within 2% of bf16 at every step" '
    fp8run cuda 0 bf16s --ckpt 0 --lr 1e-3 && fp8run cuda 1 fp8s --ckpt 0 --lr 1e-3 &&
    $PY - <<-EOF | tee -a "$TMP/figures-fp8.txt"; test ${PIPESTATUS[0]} -eq 0
	import re
	def losses(t): return [float(x) for x in re.findall(r"loss ([0-9.]+)", open("steps." + t).read())]
	b16, f8 = losses("bf16s"), losses("fp8s")
	d = max(abs(x - y) / y for x, y in zip(f8, b16))
	print("# bf16 %s\n# fp8  %s\n# largest step difference %.4f" % (" ".join("%.4f" % x for x in b16), " ".join("%.4f" % x for x in f8), d))
	assert f8 != b16 and d < 0.02
	EOF
'

# The FP8 products on a trained checkpoint's activations: 6 layers of width
# 384 trained 300 steps in bf16 (loss from 5.5 to about 2), then one step of
# 8192 tokens from that checkpoint, bf16 and FP8: the forward's loss within 1%
# and the gradient's norm within 5% (every product of every layer, forward
# and backward, on the activations and gradients of a trained model; the
# same figures at the untrained start are printed beside them).
mkdir -p "$TMP/fp8t" && $PY "$HF" make "$TMP/fp8t" 6 384 6 256 256 || echo "# the oracle could not make the trained FP8 test's weights"
test_expect_success "--fp8 1 on cuda on a trained checkpoint: loss within 1% of bf16, gradient norm within 5%" '
    with_timeout 600 "$BMLAUNCH" --metrics-port 0 --device cuda -n 1 -- "$GPT2" \
        --init-from "$TMP/fp8t/model.safetensors" --heads 6 --data "$TMP/corpus_train.bin" \
        -b 16 -t 256 --steps 300 --lr 1e-3 --warmup 20 --save-dir "$TMP/fp8t/ck" >out.train 2>&1 ||
        { tail -20 out.train; false; } &&
    grep "step *300/300" out.train &&
    for init in "$TMP/fp8t/model.safetensors" "$TMP/fp8t/ck/step-00000300"; do
        for f in 0 1; do
            with_timeout 300 "$BMLAUNCH" --metrics-port 0 --device cuda -n 1 -- "$GPT2" \
                --init-from "$init" --heads 6 --data "$TMP/corpus_val.bin" -b 32 -t 256 \
                --steps 1 --fp8 $f >out.one 2>&1 || { tail -20 out.one >&2; break 2; }
            grep -o "^0: step *1/1 | loss [0-9.]* | lr [0-9.e+-]* | norm [0-9.]*" out.one
        done
    done >one.txt &&
    cat one.txt && test $(wc -l <one.txt) -eq 4 &&
    $PY - <<-EOF | tee -a "$TMP/figures-fp8.txt"; test ${PIPESTATUS[0]} -eq 0
	import re
	r = [tuple(float(x) for x in re.search(r"loss ([0-9.]+) .* norm ([0-9.]+)", l).groups()) for l in open("one.txt")]
	(l0, n0), (l0f, n0f), (l1, n1), (l1f, n1f) = r
	dl, dn = abs(l1f - l1) / l1, abs(n1f - n1) / n1
	print("# untrained: loss bf16 %.4f fp8 %.4f (%.3f%%), norm %.4f %.4f (%.2f%%)" % (l0, l0f, 100 * abs(l0f - l0) / l0, n0, n0f, 100 * abs(n0f - n0) / n0))
	print("# trained:   loss bf16 %.4f fp8 %.4f (%.3f%%), norm %.4f %.4f (%.2f%%)" % (l1, l1f, 100 * dl, n1, n1f, 100 * dn))
	assert l1 < l0 - 1.0, "the checkpoint is not trained"
	assert (l1f, n1f) != (l1, n1), "FP8 not applied"
	assert dl <= 0.01 and dn <= 0.05
	EOF
'

# The FP8 tests' figures (step differences, losses, norms) go to the log.
[ -f "$TMP/figures-fp8.txt" ] && grep "^# " "$TMP/figures-fp8.txt"

test_expect_success "--fp8 1 on cuda with B x T not a multiple of 16 is refused with what to change" '
    { with_timeout 120 "$BMLAUNCH" --metrics-port 0 --device cuda -n 1 -- "$GPT2" --model tiny \
        --data "$TMP/corpus_train.bin" -b 3 -t 5 --steps 1 --fp8 1 >out 2>&1; rc=$?; } &&
    test $rc -ne 0 && grep -q "fp8 1 on cuda wants batch x sequence (3 x 5 = 15) .* multiples of 16" out
'

test_expect_success "the trainer on cuda: the loss falls, step lines with MFU" '
    with_timeout 300 "$BMLAUNCH" --metrics-port 0 --device cuda -n 1 -- "$GPT2" --model tiny \
        --data "$TMP/corpus_train.bin" --val "$TMP/corpus_val.bin" -b 16 -t 256 --steps 60 \
        --lr 3e-3 --warmup 5 --eval-every 30 >out 2>err || { tail -20 out err; false; } &&
    first=$(sed -n "s/^0: step *1\/60 | loss \([0-9.]*\).*/\1/p" out) &&
    last=$(sed -n "s/^0: step *60\/60 | loss \([0-9.]*\).*/\1/p" out) &&
    echo "loss $first -> $last" &&
    awk -v a="$first" -v b="$last" "BEGIN { exit !(b < a - 1.5) }" &&
    grep -q "^0: step *60/60 .* MFU [0-9.]*%" out
'
test_done
