#!/bin/bash
# The Llama trainer (bin/llama: examples/llama/train.c on the shared trainer,
# examples/common/trainer.h) on CPU ranks through bmlaunch, on the shipped
# corpus: the tiny Llama's loss falls; a save at step 20 and --resume give the
# uninterrupted run's losses; a step directory is an HF Llama directory (its
# config.json names LlamaForCausalLM and reads back through llama_config_from_file
# as the same model, and --init-from of it reproduces its validation loss);
# bad options are refused with a message, and so is a resume with another
# model, leaving the checkpoint as it was; --fp8 1 emulates FP8 products close
# to the f32 run. (The cuda model: tests/gpu/test_llama.sh.)
. "$(dirname "$0")/lib.sh"

PY=/usr/bin/python3
LLAMA=$BUILDDIR/bin/llama
export BMT_TIMEOUT=60
D=$TMP/data
RUN="--data $D/corpus_train.bin --val $D/corpus_val.bin -b 4 -t 64 --lr 3e-3 --warmup 5"
export LLAMA D RUN

# The step lines "N LOSS" of a run's output, steps from..to.
losses() { # file from to
    sed -n 's/^0: step *\([0-9]*\)\/[0-9]* | loss \([0-9.]*\) .*/\1 \2/p' "$1" | awk -v a=$2 -v b=$3 '$1 >= a && $1 <= b'
}
export -f losses

test_expect_success "llama --prepare tokenizes the shipped corpus" '
    mkdir -p $D &&
    $LLAMA --prepare $SRC/examples/gpt2/data/corpus.txt --out $D/corpus >out &&
    grep -q "^llama: wrote $D/corpus_train.bin and $D/corpus_val.bin (byte-level tokens)\$" out &&
    test -s $D/corpus_train.bin && test -s $D/corpus_val.bin
'

test_expect_success "the tiny Llama trains 2x2 on cpu: the loss falls, saves at 20 and 40" '
    with_timeout 120 $BMLAUNCH --metrics-port 0 -g 2 -n 2 --device cpu -- $LLAMA $RUN --steps 40 \
        --save-dir $TMP/ck --save-every 20 >$TMP/full.out 2>err || { tail -5 err; false; } &&
    cp $TMP/full.out out && cat out | head -3 &&
    grep -q "^0: llama: .* params (L 4, H 4, KV 2, C 64, F 176, V 256, maxT 256) | layout 2 x 2 = 4 ranks" out &&
    test $(losses out 1 40 | wc -l) -eq 40 &&
    first=$(losses out 1 1 | cut -d" " -f2) &&
    last=$(losses out 36 40 | awk "{ s += \$2 } END { print s / NR }") &&
    echo "loss $first -> $last (mean of the last 5)" &&
    awk -v a=$first -v b=$last "BEGIN { exit !(a > 5 && b < a - 1.5) }" &&
    grep -q "^0: llama: saved $TMP/ck/step-00000020\$" out &&
    grep -q "^0: llama: saved $TMP/ck/step-00000040\$" out &&
    grep -q "^0: step  40/40 | val loss [0-9.]*\$" out
'

test_expect_success "--eval-batches past the distinct batches of --val: those are used, once each, and the trainer says so" '
    $PY -c "
import numpy as np, sys
h = np.fromfile(sys.argv[1], dtype=np.int32, count=256)
t = np.fromfile(sys.argv[1], dtype=np.uint16, offset=1024)
n = 2 * 4 * 64 + 1  # two global batches of 1 rank, B 4, T 64, and the last target
h = h.copy(); h[2] = n
with open(sys.argv[2], \"wb\") as f:
    f.write(h.tobytes()); f.write(t[:n].tobytes())
" $D/corpus_val.bin $TMP/val2.bin &&
    for k in 2 3; do
        with_timeout 60 $BMLAUNCH --metrics-port 0 -n 1 --device cpu -- $LLAMA --data $D/corpus_train.bin \
            --val $TMP/val2.bin -b 4 -t 64 --steps 1 --eval-batches $k >ev$k || exit 1
    done &&
    ! grep -q "holds" ev2 &&
    grep -q "^0: llama: --val holds 2 batches of 4 x 64 tokens a rank on 1 ranks: each validation uses those, not --eval-batches 3\$" ev3 &&
    a=$(grep "val loss" ev2) && b=$(grep "val loss" ev3) && echo "$a / $b" && test -n "$a" && test "$a" = "$b"
'

test_expect_success "a step directory is an HF Llama directory: config.json names LlamaForCausalLM, --verify passes" '
    $PY -c "
import json, sys
c = json.load(open(sys.argv[1]))
assert c[\"architectures\"] == [\"LlamaForCausalLM\"] and c[\"model_type\"] == \"llama\", c
assert (c[\"num_hidden_layers\"], c[\"hidden_size\"], c[\"num_attention_heads\"], c[\"num_key_value_heads\"],
        c[\"intermediate_size\"], c[\"vocab_size\"], c[\"tie_word_embeddings\"]) == (4, 64, 4, 2, 176, 256, False), c
" $TMP/ck/step-00000040/config.json &&
    test -f $TMP/ck/step-00000040/model.safetensors.index.json &&
    grep -q "model.layers.3.mlp.down_proj.weight" $TMP/ck/step-00000040/model.safetensors.index.json &&
    $LLAMA --verify $TMP/ck >out && grep -q "^llama: .*step-00000040: ok: step 40, 7 blocks, .*config.json)\$" out
'

test_expect_success "--verify refuses a config.json that does not describe the files (layers, a tensor's shape, another model), by name" '
    for e in "s/\"num_hidden_layers\": 4/\"num_hidden_layers\": 7/@v holds 4 layers (model.layers.<N>); config.json has 7 (num_hidden_layers)" \
             "s/\"intermediate_size\": 176/\"intermediate_size\": 128/@v: tensor .model.layers.0.mlp.gate_proj.weight. is (176, 64); config.json.s model needs (128, 64)" \
             "s/\"model_type\": \"llama\"/\"model_type\": \"gpt2\"/@v/config.json: model_type is \"gpt2\"; supported"; do
        rm -rf v && cp -r $TMP/ck/step-00000040 v && sed -i "${e%%@*}" v/config.json &&
        { $LLAMA --verify v >out 2>err; rc=$?; } && test $rc -eq 1 && test ! -s out &&
        grep -q "^llama: v: config.json does not describe the files: ${e#*@}" err || { echo "$e: exit $rc"; cat err; return 1; }
    done
'

test_expect_success "--resume from the step-20 checkpoint gives the uninterrupted run its losses (21..40)" '
    mkdir ck && cp -r $TMP/ck/step-00000020 ck/ && printf step-00000020 >ck/latest &&
    with_timeout 120 $BMLAUNCH --metrics-port 0 -g 2 -n 2 --device cpu -- $LLAMA $RUN --steps 40 \
        --save-dir ck --resume >out 2>err || { tail -5 err; false; } &&
    grep -q "^0: llama: resumed from ck/step-00000020 (step 20)\$" out &&
    losses out 21 40 >resumed && losses $TMP/full.out 21 40 >straight &&
    test $(wc -l <resumed) -eq 20 && diff straight resumed &&
    test "$(grep "val loss" out)" = "$(grep "val loss" $TMP/full.out)"
'

test_expect_success "--resume with another model (2 layers) is refused, naming the block; the checkpoint stays" '
    mkdir ck && cp -r $TMP/ck/step-00000020 ck/ && printf step-00000020 >ck/latest &&
    ( cd ck/step-00000020 && sha256sum * ) >before &&
    test_must_fail with_timeout 60 $BMLAUNCH --metrics-port 0 -g 2 -n 2 --device cpu -- $LLAMA $RUN \
        --layers 2 --steps 40 --save-dir ck --resume >out 2>err &&
    grep -q "has block .model.layers.2., which the model does not have .*a checkpoint of another model" err &&
    test "$(cat ck/latest)" = step-00000020 && test "$(ls ck)" = "$(printf "latest\nstep-00000020")" &&
    ( cd ck/step-00000020 && sha256sum * ) | diff before - &&
    ! grep -q "^0: step" out
'

test_expect_success "--resume with the same blocks but another model (--max-seq 128) is refused, showing both" '
    mkdir ck && cp -r $TMP/ck/step-00000020 ck/ && printf step-00000020 >ck/latest &&
    test_must_fail with_timeout 60 $BMLAUNCH --metrics-port 0 -g 2 -n 2 --device cpu -- $LLAMA $RUN \
        --max-seq 128 --steps 40 --save-dir ck --resume >out 2>err &&
    grep -q "the checkpoint is of another model (.*\"max_seq_len\":256.*); this run.s is .*\"max_seq_len\":128" err &&
    test "$(cat ck/latest)" = step-00000020 && ! grep -q "^0: step" out
'

test_expect_success "--init-from a step directory: it reads back as the same model (1x1), its validation loss again (2x2)" '
    with_timeout 60 $BMLAUNCH --metrics-port 0 -n 1 --device cpu -- $LLAMA $RUN --lr 0 --steps 1 \
        --init-from $TMP/ck/step-00000040 --eval-batches 16 >out 2>err || { tail -5 err; false; } &&
    grep -q "^0: llama: .* params (L 4, H 4, KV 2, C 64, F 176, V 256, maxT 256) | layout 1 x 1" out &&
    with_timeout 60 $BMLAUNCH --metrics-port 0 -g 2 -n 2 --device cpu -- $LLAMA $RUN --lr 0 --steps 1 \
        --init-from $TMP/ck/step-00000040 >out4 2>err || { tail -5 err; false; } &&
    grep "val loss" out4 | sed "s/step   1\/1/step  40\/40/" >mine && grep "val loss" $TMP/full.out >theirs &&
    cat mine theirs && diff theirs mine
'

test_expect_success "bad options are refused with a message" '
    { $LLAMA --model nope --data x 2>err; rc=$?; } && test $rc -eq 2 &&
    grep -q "^llama: unknown model .nope.: use tiny, smollm-135m, llama3.2-1b or llama3.2-3b" err &&
    { $LLAMA --kv-heads 3 --data x 2>err; rc=$?; } && test $rc -eq 2 &&
    grep -q "^llama: num_attention_heads 4 is not a multiple of num_key_value_heads 3" err &&
    { $LLAMA --seq 300 --data x 2>err; rc=$?; } && test $rc -eq 2 &&
    grep -q "^llama: --seq 300 is longer than the model.s 256 positions" err &&
    { $LLAMA --fp8 2 --data x 2>err; rc=$?; } && test $rc -eq 2 && grep -q "^llama: --fp8" err &&
    { $LLAMA --fp8-scaling current --data x 2>err; rc=$?; } && test $rc -eq 2 &&
    grep -q "^llama: --fp8-scaling without --fp8 1 changes nothing" err &&
    { $LLAMA --fp8 1 --fp8-scaling sometimes --data x 2>err; rc=$?; } && test $rc -eq 2 &&
    grep -q "^llama: --fp8-scaling: .sometimes.: give delayed or current" err &&
    { $LLAMA --fp8 1 --fp8-history 0 --data x 2>err; rc=$?; } && test $rc -eq 2 &&
    { $LLAMA --fp8 1 --fp8-scaling current --fp8-history 4 --data x 2>err; rc=$?; } &&
    test $rc -eq 2 && grep -q "^llama: --fp8-history is delayed scaling.s" err &&
    for n in 33 -1 x; do
        { $LLAMA --gemm-tune $n --data x 2>err; rc=$?; } && test $rc -eq 2 && grep -q "^llama: --gemm-tune" err || return 1
    done &&
    { $LLAMA 2>err; rc=$?; } && test $rc -eq 2 && grep -q "^llama: --data PATTERN is required" err &&
    { $LLAMA --steps 0 --data x 2>err; rc=$?; } && test $rc -eq 2 &&
    grep -q "^llama: --steps needs an integer from 1 to" err
'

test_expect_success "--init-from with a size or a --model that disagrees with config.json is refused, naming both (one that repeats it is taken); C not a multiple of H is refused" '
    I=$TMP/ck/step-00000040 &&
    { $LLAMA --init-from $I --model smollm-135m --data x 2>err; rc=$?; } && test $rc -eq 2 &&
    grep -q "^llama: --model smollm-135m is L 30, H 9, KV 3, C 576, head size 64, F 1536, V 49152, tied, but $I holds L 4, H 4, KV 2, C 64, head size 16, F 176, V 256: with --init-from the model is the directory.s; leave --model out or name the directory.s\$" err &&
    { $LLAMA --init-from $I --model nope --data x 2>err; rc=$?; } && test $rc -eq 2 &&
    grep -q "^llama: unknown model .nope." err &&
    for a in "--heads 8 --kv-heads 4:num_attention_heads is 4 but --heads is 8" \
             "--kv-heads 4:num_key_value_heads is 2 but --kv-heads is 4" "--layers 2:num_hidden_layers is 4 but --layers is 2" \
             "--embd 128:hidden_size is 64 but --embd is 128" "--ffn 64:intermediate_size is 176 but --ffn is 64" \
             "--vocab 300:vocab_size is 256 but --vocab is 300"; do
        o=${a%%:*} && { $LLAMA --init-from $I $o --data x 2>err; rc=$?; } && test $rc -eq 2 &&
        grep -q "^llama: $I: config.json: ${a#*:}: with --init-from the sizes are the checkpoint.s; leave ${o%% *} out" err ||
            { echo "$o: exit $rc"; cat err; return 1; }
    done &&
    with_timeout 60 $BMLAUNCH --metrics-port 0 -n 1 --device cpu -- $LLAMA $RUN --lr 0 --steps 1 --init-from $I \
        --model tiny --layers 4 --heads 4 --embd 64 >out 2>&1 &&
    grep -q "^0: llama: .* params (L 4, H 4, KV 2, C 64, F 176, V 256, maxT 256)" out &&
    { $LLAMA --embd 100 --heads 6 --kv-heads 2 --data x 2>err; rc=$?; } && test $rc -eq 2 &&
    grep -q "^llama: the head size is C / H, and C 100 is not a multiple of H 6: change --embd or --heads" err
'

# --save-dir is checked before step 1: a run must not learn at its first save
# that the directory cannot be written, nor mix its checkpoints with another
# run's (--keep prunes by step number).
test_expect_success "--save-dir that cannot hold checkpoints or holds another run's is refused before step 1, changing nothing; --resume past --steps says so" '
    touch afile && mkdir ck && cp -r $TMP/ck/step-00000020 ck/ && printf step-00000020 >ck/latest &&
    ls -R ck >before &&
    for a in "afile:--save-dir afile is not a directory" "afile/sub:--save-dir afile/sub: Not a directory" \
             "nope/deeper:--save-dir nope/deeper: cannot make a checkpoint there (mkdir nope/deeper: No such file or directory)" \
             "ck:--save-dir ck already holds another run.s checkpoints (latest, step-00000020): continue that run with --resume, or save into another directory"; do
        { with_timeout 60 $BMLAUNCH --metrics-port 0 -n 1 --device cpu -- $LLAMA $RUN --steps 2 \
            --save-dir ${a%%:*} >out 2>&1; rc=$?; } &&
        test $rc -eq 1 && grep -q "^0: llama: rank 0: ${a#*:}\$" out && ! grep -q "^0: step" out ||
            { echo "--save-dir ${a%%:*}: exit $rc"; cat out; return 1; }
    done &&
    test ! -e nope && ls -R ck | diff before - &&
    mv ck/latest latest.kept &&
    { with_timeout 60 $BMLAUNCH --metrics-port 0 -n 1 --device cpu -- $LLAMA $RUN --steps 30 --save-dir ck \
        --resume >out 2>&1; rc=$?; } && test $rc -eq 1 &&
    grep -q "^0: llama: rank 0: --resume: ck holds checkpoints (the newest step-00000020) but no latest naming the one to resume" out &&
    ! grep -q "^0: step" out && mv latest.kept ck/latest &&
    with_timeout 60 $BMLAUNCH --metrics-port 0 -g 2 -n 2 --device cpu -- $LLAMA $RUN --steps 20 --save-dir ck \
        --resume >out 2>&1 &&
    grep -q "^0: llama: the checkpoint is at step 20 and --steps is 20: nothing left to train (raise --steps to go on)\$" out &&
    ! grep -q "^0: step" out && ls -R ck | diff before -
'

test_expect_success "a FIFO as --prepare text or --data is refused, not waited on" '
    mkfifo ff &&
    { with_timeout 20 $LLAMA --prepare ff --out fo >out 2>&1; rc=$?; } && test $rc -eq 1 &&
    grep -q "ff: not a regular file" out &&
    { with_timeout 30 $BMLAUNCH --metrics-port 0 -n 1 --device cpu -- $LLAMA --data ff -b 2 -t 16 \
        --steps 1 >out 2>&1; rc=$?; } && test $rc -eq 1 && grep -q "ff: not a regular file" out
'

# Selective checkpointing (--ckpt-budget, bmt_blocklist_set_checkpointing): the
# last layers keep their activations, the others are recomputed. The same
# numbers as recomputing every layer and as recomputing none: the step
# directories' tensors bit for bit; the activations' peak between the two.
# act_peak FILE: rank 0's activation peak in MiB.
act_peak() { sed -n "s/^0: llama: peak memory by kind (MiB): .*activation \([0-9.]*\),.*/\1/p" "$1"; }
export -f act_peak
test_expect_success "--ckpt-budget (2x2): layers 2..3 keep their activations; the same tensors bit for bit as --ckpt 1 and --ckpt 0, the activations' peak between" '
    for run in all:1 sel:"1 --ckpt-budget 2" none:0; do
        with_timeout 120 $BMLAUNCH --metrics-port 0 -g 2 -n 2 --device cpu -- $LLAMA $RUN --steps 6 \
            --ckpt ${run#*:} --save-dir $TMP/sel-${run%%:*} >$TMP/sel-${run%%:*}.out 2>err ||
            { tail -5 err; return 1; }
    done &&
    grep "checkpointing within" $TMP/sel-sel.out &&
    grep -q "^0: llama: checkpointing within 2.0 MiB: layers 2..3 keep their activations (2 x 0.[0-9] MiB), layers 0..1 are recomputed; the head keeps its logits (nothing to recompute)\$" $TMP/sel-sel.out &&
    ! grep -q "checkpointing within" $TMP/sel-all.out &&
    n=0 && for f in $TMP/sel-all/step-00000006/*.safetensors; do
        cmp $f $TMP/sel-sel/step-00000006/${f##*/} && cmp $f $TMP/sel-none/step-00000006/${f##*/} &&
        n=$((n + 1)) || return 1
    done && echo "$n files the same" && test $n -eq 14 &&
    a1=$(act_peak $TMP/sel-all.out) && ab=$(act_peak $TMP/sel-sel.out) && a0=$(act_peak $TMP/sel-none.out) &&
    echo "activation peaks: every layer recomputed $a1, 2 of 4 kept $ab, none recomputed $a0 MiB" &&
    awk -v a=$a1 -v b=$ab -v c=$a0 "BEGIN { exit !(a < b && b < c) }"
'

# keep_check: what the budget counts per kept layer (llama_model_act_bytes) is
# what keeping a layer holds, byte for byte, after a forward.
test_expect_success "--ckpt-budget's arithmetic: each kept layer holds act_bytes' layer exactly (keep_check, cpu)" '
    with_timeout 120 "$BMLAUNCH" --metrics-port 0 -n 1 -- "$PROGS/keep_check" --model llama >out 2>err &&
    grep -q "^0: keep_check: 5 passed, 0 failed" out &&
    grep -q "^0: ok 3 - llama: 3 of 4 layers kept hold 3 x act_bytes. layer more: [1-9][0-9]* bytes" out
'

test_expect_success "--keep-attention 1 on the cpu model is refused, saying it is for cuda; 0 and 2" '
    { with_timeout 60 "$BMLAUNCH" --metrics-port 0 -n 1 -- $LLAMA $RUN --steps 1 --keep-attention 1 \
        >out 2>&1; rc=$?; } &&
    test $rc -ne 0 && grep -q "keeping the attention outputs .* is for the cuda model (--device cuda)" out &&
    with_timeout 60 "$BMLAUNCH" --metrics-port 0 -n 1 -- $LLAMA $RUN --steps 1 --keep-attention 0 >out 2>&1 &&
    { $LLAMA --data x --keep-attention 2 2>err; rc=$?; } && test $rc -eq 2 &&
    grep -q "^llama: --keep-attention" err
'

test_expect_success "--ckpt-budget: refused without checkpointing, below 0, and not a number" '
    { $LLAMA --data x --ckpt 0 --ckpt-budget 5 2>err; rc=$?; } && test $rc -eq 2 &&
    grep -q "^llama: --ckpt-budget chooses which layers checkpointing spares: it needs --ckpt 1" err &&
    { $LLAMA --data x --ckpt-budget -1 2>err; rc=$?; } && test $rc -eq 2 &&
    grep -q "^llama: --ckpt-budget needs a number from 0 to" err &&
    { $LLAMA --data x --ckpt-budget lots 2>err; rc=$?; } && test $rc -eq 2 &&
    grep -q "^llama: --ckpt-budget needs a number" err
'

# --fp8 1 on the cpu: the four products of each layer (q|k|v and gate|up
# stacked, one scale each) with their operands
# through FP8 (nn_fp8_linear_*, checked op by op against the formats'
# definitions in test_fp8): close to the f32 run from the same seed, not the
# same, under delayed scaling (the default) and current scaling, which share
# their first step and then part; the scaling's counts printed at the end.
# (A NaN operand's products are NaN: test_fp8, and test_gpt2's run.)
test_expect_success "--fp8 1 (cpu, 2x2), delayed and current scaling: 20 steps within 1% of the f32 run, not equal to it; the loss falls" '
    for f in 0 1 c; do
        o="--fp8 $f"
        test $f = c && o="--fp8 1 --fp8-scaling current"
        with_timeout 300 $BMLAUNCH --metrics-port 0 -g 2 -n 2 --device cpu -- $LLAMA $RUN --steps 20 \
            --seed 7 $o >out.$f 2>&1 || { tail -5 out.$f; exit 1; }
    done &&
    grep -q "^0: llama: rank 0: fp8: delayed scaling over 16 passes; 20 passes; [0-9]* operand-passes saturated, 0 unscalable" out.1 &&
    grep -q "^0: llama: rank 0: fp8: current scaling; 20 passes; 0 operand-passes saturated, 0 unscalable" out.c &&
    ! grep -q "fp8:" out.0 &&
    $PY - <<-EOF
	import re
	loss = [[float(x) for x in re.findall(r"^0: step +\d+/20 \| loss ([0-9.]+)", open("out." + f).read(), re.M)] for f in ("0", "1", "c")]
	assert all(len(l) == 20 for l in loss), loss
	for fp8 in loss[1:]:
	    rel = [abs(a - b) / a for a, b in zip(loss[0], fp8)]
	    print("f32 %.4f -> %.4f, fp8 %.4f -> %.4f, largest step difference %.2g" % (loss[0][0], loss[0][-1], fp8[0], fp8[-1], max(rel)))
	    assert max(rel) < 0.01, max(rel)
	    assert loss[0] != fp8, "the same losses: FP8 not applied"
	    assert sum(fp8[-5:]) / 5 < fp8[0] - 1.0, fp8
	assert loss[1][0] == loss[2][0] and loss[1] != loss[2], "delayed: the first step current, then its own"
	EOF
'

test_expect_success "--gemm-tune 4 on the cpu changes nothing: the same losses as without" '
    for g in 0 4; do
        with_timeout 120 $BMLAUNCH --metrics-port 0 -n 1 --device cpu -- $LLAMA $RUN --steps 3 \
            --gemm-tune $g >out.$g 2>err || { tail -5 err; return 1; }
        losses out.$g 1 3 >l.$g
    done && test $(wc -l <l.0) -eq 3 && cmp l.0 l.4
'

test_expect_success "--init-from a GPT-2 checkpoint is refused, naming its model_type" '
    with_timeout 60 $BMLAUNCH --metrics-port 0 -n 1 --device cpu -- $BUILDDIR/bin/gpt2 $RUN --steps 1 \
        --save-dir g >out 2>err || { tail -5 err; false; } &&
    { $LLAMA $RUN --init-from g/step-00000001 2>err; rc=$?; } && test $rc -eq 1 &&
    cat err && grep -q "^llama: g/step-00000001/config.json: .*model_type.*gpt2" err
'

test_expect_success "--device cuda: refused by bmlaunch without a GPU; with one, a step of the bf16 model" '
    { with_timeout 120 $BMLAUNCH --metrics-port 0 -n 1 --device cuda -- $LLAMA $RUN --steps 1 >out 2>err; rc=$?; } &&
    cat err; if grep -q "^bmlaunch: --device cuda, but" err; then test $rc -eq 2; else
        test $rc -eq 0 && grep -q "^0: step *1/1 | loss [0-9.]* " out; fi
'

test_done
