#!/bin/bash
# HF's config.json beside GPT-2 weights (examples/gpt2/model.c:
# gpt2_config_from_file, gpt2_config_from_hf_json, gpt2_hf_config_json), on CPU
# ranks through bmlaunch:
# - HF-style directories (tests/tools/hf_gpt2_load.py make: the weights of
#   tests/tools/gpt2_oracle.py with openai-community/gpt2's config.json at their
#   sizes and n_head 8, then one value changed): the good one loads with its
#   heads and no --heads, given as a directory, a file or an index; every value
#   the trainer does not compute is refused, naming the file, the field, the
#   value and what is supported; so is malformed JSON;
# - an independent reader (tests/tools/hf_gpt2_load.py check: what
#   from_pretrained does with a directory, its own safetensors parser, the model
#   the config describes in float64) gets the trainer's loss from the same
#   directory, and other losses when the config says relu, eps 1e-2 or 4 heads
#   (which is why those values are refused, not ignored); it refuses what
#   from_pretrained refuses;
# - the trainer's checkpoint directories carry a config.json that the reader
#   loads as from_pretrained would, with the trainer's loss, and that the trainer
#   reads back without --heads.
. "$(dirname "$0")/lib.sh"

PY=/usr/bin/python3
ORACLE=$SRC/tests/tools/gpt2_oracle.py
HFL=$SRC/tests/tools/hf_gpt2_load.py
GPT2=$BUILDDIR/bin/gpt2
export BMT_TIMEOUT=60

$PY "$ORACLE" make "$TMP" || echo "# the oracle could not make its files"

# mk DIR [hf_gpt2_load.py make options]: an HF-style directory of the oracle's
# weights (L 2, C 32, V 67, maxT 24) whose config.json says n_head 8.
mk() {
    local d=$1
    shift
    $PY "$HFL" make "$TMP/model.safetensors" "$d" --heads 8 "$@" >/dev/null
}
# train [gpt2 options]: the trainer, one rank, one step of the oracle's data; output in ./out.
train() {
    with_timeout 60 "$BMLAUNCH" --metrics-port 0 -n 1 -- "$GPT2" --data "$TMP/data.bin" -b 2 -t 16 \
        --steps 1 "$@" >out 2>&1
}
# loss1 DIR [options]: gpt2_check's loss of the first batch (10 digits) from DIR, on stdout.
loss1() {
    local d=$1
    shift
    with_timeout 60 "$BMLAUNCH" --metrics-port 0 -n 1 -- "$PROGS/gpt2_check" --init "$d" \
        --data "$TMP/data.bin" -b 2 -t 16 --out . --steps 0 "$@" >check.out 2>&1 ||
        { cat check.out >&2; return 1; }
    sed -n 's/^0: loss1 //p' check.out
}

test_expect_success "a config.json beside the weights gives the heads: H 8 with no --heads (C 32 has no C/64)" '
    mk good && train --init-from good &&
    grep -q "^0: gpt2: .* params (L 2, H 8, C 32, V 67, maxT 24)" out &&
    test $(grep -c "^0: step *1/1 | loss" out) -eq 1
'

test_expect_success "without config.json the same weights still need --heads (the behaviour before it)" '
    mk bare --no-config && test ! -e bare/config.json &&
    { train --init-from bare; rc=$?; } && test $rc -ne 0 &&
    grep -q "bare: the embedding size 32 is not a multiple of 64: give the heads" out &&
    train --init-from bare --heads 4 && grep -q "^0: gpt2: .* params (L 2, H 4, C 32" out
'

test_expect_success "the config.json beside a file or an index given to --init-from counts too" '
    mk good && mk sharded --shards 3 --prefix transformer. &&
    test -f sharded/model.safetensors.index.json &&
    train --init-from good/model.safetensors && grep -q "params (L 2, H 8, C 32, V 67, maxT 24)" out &&
    train --init-from sharded/model.safetensors.index.json &&
    grep -q "params (L 2, H 8, C 32, V 67, maxT 24)" out &&
    train --init-from sharded && grep -q "params (L 2, H 8, C 32, V 67, maxT 24)" out
'

test_expect_success "--heads that agrees with config.json is accepted; one that disagrees is refused naming both" '
    mk good && train --init-from good --heads 8 && grep -q "params (L 2, H 8," out &&
    { train --init-from good --heads 4; rc=$?; } && test $rc -ne 0 &&
    grep -qF "good/config.json: n_head is 8 but --heads is 4" out && ! grep -q "step *1/1" out
'

test_expect_success "accepted: gelu_pytorch_tanh, n_inner 4C, reorder_and_upcast_attn, dropout 0.1, aliases, GPT2Model" '
    for set in activation_function=\"gelu_pytorch_tanh\" n_inner=128 reorder_and_upcast_attn=true \
               resid_pdrop=0.1 hidden_size=32 num_attention_heads=8 architectures=[\"GPT2Model\"] \
               n_inner=null; do
        rm -rf d && mk d --set "$set" && train --init-from d || { echo "$set:"; cat out; exit 1; }
        grep -q "params (L 2, H 8, C 32, V 67, maxT 24)" out || { echo "$set:"; cat out; exit 1; }
    done
'

# refused DESCRIPTION MESSAGE [make options]: the trainer exits non-zero before
# any step and prints MESSAGE (a fixed string) after "d/config.json: ". It
# refuses while reading its options, before bmt_init, so it runs here as a job
# of one without bmlaunch (as the first tests show it does under bmlaunch).
refused() {
    local what=$1 msg=$2
    shift 2
    test_expect_success "refused: $what" "
        mk d $(printf '%q ' "$@") &&
        { with_timeout 60 \$GPT2 --data \$TMP/data.bin -b 2 -t 16 --steps 1 --init-from d >out 2>&1; rc=\$?; } &&
        test \$rc -ne 0 &&
        grep -qF $(printf '%q' "d/config.json: $msg") out && ! grep -q 'step *1/1' out ||
        { cat out; false; }
    "
}
refused "another activation (relu)" 'activation_function is "relu"; supported: "gelu_new", "gelu_pytorch_tanh" (GELU, tanh)' \
    --set 'activation_function="relu"'
refused "exact GELU (gelu, erf), not the tanh approximation" 'activation_function is "gelu"; supported:' \
    --set 'activation_function="gelu"'
refused "another LayerNorm epsilon (1e-2)" 'layer_norm_epsilon is 0.01; supported: 1e-5' \
    --set layer_norm_epsilon=1e-2
refused "an epsilon off by one part in 1e4" 'layer_norm_epsilon is 1.0001e-5; supported: 1e-5' \
    --set layer_norm_epsilon=1.0001e-5
refused "an untied LM head" 'tie_word_embeddings is false; supported: true' \
    --set tie_word_embeddings=false
refused "an MLP of 3C (n_inner 96)" 'n_inner is 96; supported: null or 128 (4 x n_embd)' --set n_inner=96
refused "unscaled attention" 'scale_attn_weights is false; supported: true' --set scale_attn_weights=false
refused "attention scaled by 1/(layer+1)" 'scale_attn_by_inverse_layer_idx is true; supported: false' \
    --set scale_attn_by_inverse_layer_idx=true
refused "cross-attention" 'add_cross_attention is true; supported: false' --set add_cross_attention=true
refused "another model type" 'model_type is "llama"; supported: "gpt2"' --set 'model_type="llama"'
refused "another architecture" 'architectures[] is "GPTNeoXForCausalLM"; supported: "GPT2LMHeadModel", "GPT2Model"' \
    --set 'architectures=["GPTNeoXForCausalLM"]'
refused "rotary positions" 'rope_theta is 10000; supported: absent (positions are learned: wpe)' \
    --set rope_theta=10000
refused "pruned heads" 'pruned_heads is {"0":[1]}; supported: {} (every head)' --set 'pruned_heads={"0": [1]}'
refused "n_layer other than the weights'" 'n_layer is 3 but the weights have 2 layers' --set n_layer=3
refused "no n_layer: GPT2Config's 12, not the weights' 2" 'n_layer is 12 (absent: the default) but the weights have 2 layers' \
    --unset n_layer
refused "n_embd other than the weights'" 'n_embd is 64 but the weights have 32 columns in wte' --set n_embd=64
refused "vocab_size other than the weights'" 'vocab_size is 50257 but the weights have 67 rows in wte' \
    --set vocab_size=50257
refused "n_positions other than the weights'" 'n_positions is 1024 but the weights have 24 rows in wpe' \
    --set n_positions=1024
refused "heads that do not divide C" 'n_head is 5: it must be in 1..1024 and divide n_embd 32' --set n_head=5
refused "an alias that disagrees" 'n_embd is 32 but its alias hidden_size is 48' --set hidden_size=48
refused "malformed: not JSON" 'not valid JSON: ' --config-text '{"n_head": 8,'
refused "malformed: not an object" 'malformed: a JSON object is needed, not an array' --config-text '[8]'
refused "malformed: a key twice" 'not valid JSON: duplicate object key' --config-text '{"n_head": 8, "n_head": 4}'
refused "malformed: n_head a string" 'malformed: "n_head" must be an integer, not a string' --set 'n_head="8"'
refused "malformed: a boolean a string" 'malformed: "tie_word_embeddings" must be true or false, not a string' \
    --set 'tie_word_embeddings="yes"'
refused "malformed: epsilon a string" 'malformed: "layer_norm_epsilon" must be a number, not a string' \
    --set 'layer_norm_epsilon="1e-5"'

# ------------------------------------------------------------ the reader

test_expect_success "the reader loads the good directory as from_pretrained would; its float64 loss is the trainer's (1e-5)" '
    mk good && l=$(loss1 good) && test -n "$l" &&
    $PY "$HFL" check good --data "$TMP/data.bin" -b 2 -t 16 --loss $l >check.txt &&
    cat check.txt && test $(grep -c "^ok " check.txt) -eq 3 && ! grep -q FAIL check.txt &&
    grep -q "config (L 2, H 8, C 32, V 67, maxT 24, gelu_new, eps 1e-05, tied), 1 files" check.txt
'

test_expect_success "the same through an index over 3 shards with transformer. names" '
    mk sharded --shards 3 --prefix transformer. && l=$(loss1 sharded) &&
    $PY "$HFL" check sharded --data "$TMP/data.bin" -b 2 -t 16 --loss $l >check.txt &&
    cat check.txt && grep -q ", 3 files, 28 parameters" check.txt && ! grep -q FAIL check.txt
'

test_expect_success "a directory holding model.safetensors and an index is read through model.safetensors, as from_pretrained reads it: the index (its shards absent here) is not opened" '
    mk good && mk sharded --shards 3 && mk both && cp sharded/model.safetensors.index.json both/ &&
    ! test -e both/model-00001-of-00003.safetensors &&
    train --init-from both && grep -q "params (L 2, H 8, C 32, V 67, maxT 24)" out &&
    l=$(loss1 good) && test -n "$l" && test "$(loss1 both)" = "$l" &&
    $PY "$HFL" check both --data "$TMP/data.bin" -b 2 -t 16 --loss $l >check.txt &&
    cat check.txt && grep -q ", 1 files, 28 parameters" check.txt && ! grep -q FAIL check.txt
'

test_expect_success "the values refused change the model: the reader's loss moves (> 1e-5 relative) under relu, eps 1e-2, 4 heads, 1/(layer+1)" '
    mk good && base=$($PY "$HFL" check good --data "$TMP/data.bin" | sed -n "s/^loss //p") &&
    for set in activation_function=\"relu\" layer_norm_epsilon=1e-2 n_head=4 scale_attn_by_inverse_layer_idx=true; do
        rm -rf v && mk v --set "$set" &&
        l=$($PY "$HFL" check v --data "$TMP/data.bin" | sed -n "s/^loss //p") && test -n "$l" &&
        $PY -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); print(sys.argv[3], \"loss\", b, \"against\", a); assert abs(a - b) > 1e-5 * a" $base $l "$set" ||
        exit 1
    done
'

test_expect_success "the reader refuses what from_pretrained refuses: unexpected, missing, no format, no config, truncated" '
    mk x1 --extra h.0.attn.rotary_emb && mk x2 --drop h.1.ln_2.bias &&
    mk x3 --no-metadata && mk x4 --no-config && mk x5 &&
    f=x5/model.safetensors && head -c $(($(stat -c %s $f) - 4)) $f >t && mv t $f &&
    for d in x1:"unexpected tensors" x2:"missing tensors" x3:"format" x4:"no config.json" \
             x5:"do not hold F32"; do
        { $PY "$HFL" check ${d%%:*} >check.txt; rc=$?; } && test $rc -ne 0 &&
        grep -q "^FAIL .*${d#*:}" check.txt || { echo "$d:"; cat check.txt; exit 1; }
    done
'

# ------------------------------------------------------------ the trainer's checkpoints

test_expect_success "a checkpoint of the trainer (2 ranks) has a config.json; the reader loads it as from_pretrained would, with the trainer's loss" '
    mk good &&
    with_timeout 120 "$BMLAUNCH" --metrics-port 0 -n 2 -- "$GPT2" --init-from good --data "$TMP/data.bin" \
        -b 2 -t 16 --steps 2 --save-dir S >out 2>&1 || { cat out; false; } &&
    step=S/$(cat S/latest) && test -f $step/model.safetensors.index.json &&
    { test -f $step/config.json ||
      { echo "FAIL $step has no config.json: the trainer does not write gpt2_hf_config_json into its checkpoints (bmt_ckpt_save)"; false; }; } &&
    $PY - $step/config.json <<-EOF &&
	import json, sys
	c = json.load(open(sys.argv[1]))
	want = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 2, "n_head": 8,
	        "n_embd": 32, "vocab_size": 67, "n_positions": 24, "n_inner": None,
	        "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True,
	        "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
	        "reorder_and_upcast_attn": False, "add_cross_attention": False, "resid_pdrop": 0,
	        "embd_pdrop": 0, "attn_pdrop": 0, "bos_token_id": None, "eos_token_id": None,
	        "torch_dtype": "float32"}
	bad = {k: (c.get(k, "absent"), v) for k, v in want.items() if c.get(k, "absent") != v}
	assert not bad, bad
	print("config.json: %s" % json.dumps(c, sort_keys=True))
	EOF
    l=$(loss1 $step) && test -n "$l" &&
    $PY "$HFL" check $step --data "$TMP/data.bin" -b 2 -t 16 --loss $l >check.txt &&
    cat check.txt && ! grep -q FAIL check.txt && grep -q "config (L 2, H 8, C 32, V 67, maxT 24" check.txt &&
    train --init-from $step && grep -q "params (L 2, H 8, C 32, V 67, maxT 24)" out
'

test_done
