#!/bin/bash
# The Llama trainer's checkpoints are HF-loadable as written (issue 23 item 3):
# transformers' LlamaForCausalLM.from_pretrained(step dir), unchanged, loads
# every weight with nothing missing or unexpected and gives the validation loss
# the trainer printed (tests/gpu/llama_hf.py). The trainer runs on CPU ranks
# (its CUDA path is not written yet); this test lives in tests/gpu because the
# GPU machine is where transformers is installed. Cases: the tiny preset (GQA
# 2:1, untied) at 1x2 and SmolLM-135M's shape (GQA 3:1, tied, 9 heads) at 1x1.
. "$(dirname "$0")/../integration/lib.sh"
PY=python3
LLAMA=$BUILDDIR/bin/llama
if ! $PY -c 'import transformers, torch, numpy' 2>/dev/null; then
    test_expect_success "$PY can import transformers, torch and numpy (the oracle needs them)" 'false'
    test_done
    exit
fi
$BUILDDIR/bin/gpt2 --prepare "$SRC/examples/gpt2/data/corpus.txt" --out "$TMP/c" >/dev/null ||
    echo "# could not make the corpus shards"
export PY LLAMA

# train NAME LAYOUT TIED ARGS...: 3 steps, a checkpoint, then HF on the step directory.
train_and_load() {
    local g=$1 n=$2 tied=$3 B=$4 T=$5
    shift 5
    with_timeout 300 $BMLAUNCH -g $g -n $n --device cpu -- $LLAMA --data "$TMP/c_train.bin" \
        --val "$TMP/c_val.bin" -b $B -t $T --steps 3 --eval-batches 1 --save-dir ck "$@" >out 2>err ||
        { tail -5 err; return 1; }
    local want
    want=$(sed -n "s/^0: step *3\/3 | val loss \([0-9.]*\)$/\1/p" out)
    test -n "$want" || { echo "no val loss printed"; tail -5 out; return 1; }
    $PY "$SRC/tests/gpu/llama_hf.py" "ck/$(cat ck/latest)" "$TMP/c_val.bin" $B $T $((g * n)) "$want" $tied
}

test_expect_success "tiny (GQA 2:1, untied), 1x2: from_pretrained loads it unchanged and gives its val loss" '
    train_and_load 1 2 0 2 32 --model tiny
'

test_expect_success "SmolLM-135M shape (GQA 3:1, tied), 1x1: the same" '
    train_and_load 1 1 1 1 16 --model smollm-135m
'

test_done
