#!/bin/bash
# bin/generate (examples/generate, docs/generate.md) against PyTorch: the
# oracle (tests/tools/generate_oracle.py) writes four tiny random HF
# directories — GPT-2 tied with the "transformer." prefix in f32 in one file;
# GPT-2 without the prefix, with the original files' mask buffers, in bf16 in
# three files and an index; Llama with GQA 2:1, untied, Llama 3 RoPE scaling
# in f32; Llama MHA, tied, in bf16 in two files — and computes, with its own
# float64 models and no KV cache, the greedy continuation (which generate must
# equal token for token, with no near ties), the logits along generate's path
# (1e-5), the top-k sets of its sampled steps, and the seeded draw of
# docs/generate.md replayed in Python (the same ids). Then: the cache equals
# a recompute without it (the same bits), top-k 1 is greedy at any
# temperature, a seed repeats and another differs, the end-of-sequence token
# stops, checkpoints of bin/llama and bin/gpt2 generate (and equal the
# oracle), the CUDA decoder's host code on a CPU emulation of nn's CUDA layers
# follows the oracle within bf16 bounds (tests/gpu/test_generate.sh runs it on
# a GPU), end-of-sequence ids and generation settings are taken where
# transformers takes them (generation_config.json, else config.json with its
# class's defaults), and bad input is refused with one line and its exit code.
. "$(dirname "$0")/lib.sh"

PY=/usr/bin/python3
ORACLE=$SRC/tests/tools/generate_oracle.py
GEN=$BUILDDIR/bin/generate
M=$TMP/models
C=$TMP/c # what generate printed: NAME.ids, NAME.dump
mkdir -p "$M" "$C"
export PY ORACLE GEN M C

. "$(dirname "$0")/generate_lib.sh"

MODELS="g1 g2 l1 l2"
export MODELS P LONG

# Each case: NAME MODEL PROMPT then generate's options; its ids in $C/NAME.ids.
CASES="
g1.greedy g1 $P -n 24 --dump-logits $C/g1.greedy.dump
g2.greedy g2 $P -n 24 --dump-logits $C/g2.greedy.dump
l1.greedy l1 $P -n 24 --dump-logits $C/l1.greedy.dump
l2.greedy l2 $P -n 24 --dump-logits $C/l2.greedy.dump
l1.long l1 $LONG -n 30 --dump-logits $C/l1.long.dump
g1.topk g1 $P -n 40 --temperature 3 --top-k 5 --seed 1 --dump-logits $C/g1.topk.dump
g2.topk g2 $P -n 40 --temperature 3 --top-k 5 --seed 2
l1.topk l1 $P -n 40 --temperature 3 --top-k 5 --seed 3 --dump-logits $C/l1.topk.dump
l2.topk l2 $P -n 40 --temperature 3 --top-k 5 --seed 4
g1.wide g1 $P -n 40 --temperature 3 --seed 1
l1.wide l1 $P -n 40 --temperature 3 --seed 3
g1.replay g1 $P -n 30 --temperature 1.5 --seed 11
g2.replay g2 $P -n 30 --temperature 2 --top-k 0 --seed 0
l1.replay l1 $P -n 30 --temperature 1 --top-k 7 --seed 18446744073709551615
l2.replay l2 $P -n 30 --temperature 0.8 --top-k 20 --seed 5
"
export CASES

# ids NAME: the ids generate printed for case NAME, comma separated.
ids() { tr ' ' , <"$C/$1.ids"; }
# oracle_says NAME: the oracle's line for NAME, without the name.
oracle_says() { sed -n "s/^$1 //p" "$TMP/oracle.txt"; }
export -f ids oracle_says

test_expect_success "checkpoints of bin/llama and bin/gpt2 (2 steps on the shipped corpus) are written" '
    $BUILDDIR/bin/llama --prepare $SRC/examples/gpt2/data/corpus.txt --out corpus >/dev/null &&
    for t in llama gpt2; do
        with_timeout 60 $BMLAUNCH --metrics-port 0 -n 1 --device cpu -- $BUILDDIR/bin/$t \
            --data corpus_train.bin -b 4 -t 64 --steps 2 --save-dir $TMP/ck-$t >out 2>&1 ||
            { tail -5 out; exit 1; }
        test -f $TMP/ck-$t/step-00000002/config.json
    done
'

test_expect_success "a checkpoint generates: --prompt bytes in, ids and --text out (llama, gpt2)" '
    for t in llama gpt2; do
        $GEN $TMP/ck-$t/step-00000002 --prompt "The devil " -n 20 --text >out 2>err &&
        test ! -s err && test $(wc -l <out) -eq 2 &&
        head -1 out >$C/ck-$t.ids && cat $C/ck-$t.ids &&
        test $(wc -w <$C/ck-$t.ids) -eq 20 &&
        awk "{ for (i = 1; i <= NF; i++) if (\$i !~ /^[0-9]+\$/ || \$i > 255) exit 1 }" $C/ck-$t.ids &&
        $PY -c "import sys; ids = open(sys.argv[1]).read().split(); t = open(sys.argv[2], \"rb\").read().split(b\"\\n\", 1)[1]
assert t == bytes(int(i) for i in ids) + b\"\\n\", (t, ids)" $C/ck-$t.ids out &&
        $GEN $TMP/ck-$t/step-00000002 --prompt "The devil " -n 20 --temperature 1 --seed 1 \
            --dump-logits $C/ck-$t.sampled.dump >$C/ck-$t.sampled.ids || exit 1
    done
'

test_expect_success "a checkpoint directory with latest is read at its latest step" '
    $GEN $TMP/ck-llama --prompt "The devil " -n 20 >out && diff $C/ck-llama.ids out
'

test_expect_success "a --save-dir whose re-saved step a crash left aside as .tmp-NAME~old is read there, as the trainers load it (docs/checkpoints.md); a step latest names that is not there is named, exit 1" '
    mkdir aside && cp -r $TMP/ck-llama/step-00000002 "aside/.tmp-step-00000002~old" &&
    echo step-00000002 >aside/latest && $BUILDDIR/bin/llama --verify aside >/dev/null &&
    $GEN aside --prompt "The devil " -n 20 >out && diff $C/ck-llama.ids out &&
    echo step-00000009 >aside/latest && rc=0 && $GEN aside --prompt-ids 1 >out 2>err || rc=$? &&
    cat err && test $rc -eq 1 && test ! -s out &&
    test "$(cat err)" = "generate: aside/latest names step-00000009, which aside does not hold (No such file or directory): give a step directory, or write the name of one into latest"
'

test_expect_success "generate runs every case (greedy, sampled, dumped logits) and the oracle computes its own" '
    echo "$CASES" | while read -r name model prompt args; do
        [ -n "$name" ] || continue
        $GEN $M/$model --prompt-ids $prompt $args >$C/$name.ids 2>err || { cat err; exit 1; }
        test ! -s err && test $(wc -l <$C/$name.ids) -eq 1 || { echo "$name"; cat err; exit 1; }
    done &&
    {
        for m in $MODELS; do
            echo "$m.greedy greedy $M/$m $P 24"
            echo "$m.greedy-logits logits $M/$m $P $(ids $m.greedy) $C/$m.greedy.dump"
            echo "$m.topk topk $M/$m $P $(ids $m.topk) 5"
        done
        echo "l1.long greedy $M/l1 $LONG 30"
        echo "l1.long-logits logits $M/l1 $LONG $(ids l1.long) $C/l1.long.dump"
        for c in g1 l1; do
            echo "$c.topk-logits logits $M/$c $P $(ids $c.topk) $C/$c.topk.dump"
            echo "$c.wide topk $M/$c $P $(ids $c.wide) 5"
        done
        echo "g1.replay replay $M/g1 $P 30 1.5 0 11"
        echo "g2.replay replay $M/g2 $P 30 2 0 0"
        echo "l1.replay replay $M/l1 $P 30 1 7 18446744073709551615"
        echo "l2.replay replay $M/l2 $P 30 0.8 20 5"
        for t in llama gpt2; do
            ck=$TMP/ck-$t/step-00000002 prompt=$(printf "The devil " | od -An -tu1 | xargs | tr " " ,)
            echo "ck-$t greedy $ck $prompt 20"
            echo "ck-$t.sampled logits $ck $prompt $(ids ck-$t.sampled) $C/ck-$t.sampled.dump"
        done
    } >batch &&
    with_timeout 120 $PY "$ORACLE" batch batch >$TMP/oracle.txt &&
    cat $TMP/oracle.txt && test $(wc -l <$TMP/oracle.txt) -eq $(wc -l <batch)
'

# same NAME: generate's ids equal the oracle's, token for token, with no step
# whose two largest logits are within 1e-3 (a near tie would make the
# comparison a coin toss); the first difference is printed.
same() {
    local ours theirs gap
    ours=$(cat $C/$1.ids)
    theirs=$(oracle_says $1 | sed -n "s/^ids \(.*\) gap .*/\1/p")
    gap=$(oracle_says $1 | sed -n "s/.* gap //p")
    echo "generate: $ours"
    echo "oracle:   $theirs (smallest gap between a step's two largest logits: $gap)"
    test -n "$theirs" || return 1
    $PY -c "
import sys
a, b = sys.argv[1].split(), sys.argv[2].split()
bad = [i for i in range(max(len(a), len(b))) if a[i:i + 1] != b[i:i + 1]]
if bad:
    sys.exit(\"first difference at new token %d: generate %s, oracle %s\" % (bad[0], a[bad[0]:bad[0] + 1], b[bad[0]:bad[0] + 1]))" "$ours" "$theirs" &&
    awk -v g=$gap "BEGIN { exit !(g > 1e-3) }"
}
logits_ok() { # NAME
    oracle_says $1 && oracle_says $1 | grep -q "^logits .* ok\$"
}
export -f same logits_ok

for x in "g1:GPT-2, tied, transformer. names, f32, one file" \
         "g2:GPT-2 without the prefix, mask buffers, bf16, three files and an index" \
         "l1:Llama GQA 2:1, untied, Llama 3 RoPE scaling, f32" \
         "l2:Llama MHA, tied, bf16, two files and an index"; do
    m=${x%%:*}
    test_expect_success "greedy on $m (${x#*:}) equals the float64 oracle token for token; logits within 1e-5" "
        same $m.greedy && logits_ok $m.greedy-logits
    "
done

test_expect_success "greedy after a 70-token prompt (a prefill of two chunks) equals the oracle; logits within 1e-5" '
    same l1.long && logits_ok l1.long-logits
'

test_expect_success "the logits along sampled paths (temperature 3, top-k 5) are the oracle's within 1e-5" '
    logits_ok g1.topk-logits && logits_ok l1.topk-logits
'

test_expect_success "--top-k 5 at temperature 3: every sampled id is among the oracle's 5 largest logits of its step" '
    for m in $MODELS; do
        oracle_says $m.topk && oracle_says $m.topk | grep -q "^outside 0 of 40 " || exit 1
        # and it sampled: not the greedy path
        test "$(cut -d" " -f1-24 $C/$m.topk.ids)" != "$(cat $C/$m.greedy.ids)" || exit 1
    done
'

test_expect_success "without --top-k the same draws leave the top 5 (the check above can fail)" '
    for m in g1 l1; do
        oracle_says $m.wide && n=$(oracle_says $m.wide | sed -n "s/^outside \([0-9]*\) of 40 .*/\1/p") &&
        test "$n" -ge 3 || exit 1
    done
'

test_expect_success "the seeded draw is the documented one: the oracle replays it in Python and gets the same ids" '
    for c in g1.replay g2.replay l1.replay l2.replay; do
        echo "$c: $(cat $C/$c.ids)" && oracle_says $c &&
        test "ids $(cat $C/$c.ids)" = "$(oracle_says $c)" || exit 1
    done
'

test_expect_success "the KV cache equals a recompute without it: the same ids and the same logits, bit for bit" '
    for m in $MODELS; do
        $GEN $M/$m --prompt-ids $P -n 24 --dump-logits b.dump --no-cache >b &&
        diff $C/$m.greedy.ids b && cmp $C/$m.greedy.dump b.dump || { echo "$m greedy"; exit 1; }
    done &&
    $GEN $M/l1 --prompt-ids $LONG -n 30 --dump-logits b.dump --no-cache >b &&
    diff $C/l1.long.ids b && cmp $C/l1.long.dump b.dump &&
    for x in g1:1 l1:3; do # the seeds of the topk cases
        $GEN $M/${x%:*} --prompt-ids $P -n 40 --temperature 3 --top-k 5 --seed ${x#*:} \
            --dump-logits b.dump --no-cache >b &&
        diff $C/${x%:*}.topk.ids b && cmp $C/${x%:*}.topk.dump b.dump || { echo "$x"; exit 1; }
    done &&
    for m in g2 l2; do
        $GEN $M/$m --prompt-ids $P -n 30 --temperature 0.7 --seed 4 >a &&
        $GEN $M/$m --prompt-ids $P -n 30 --temperature 0.7 --seed 4 --no-cache >b &&
        diff a b || { echo "$m sampled"; exit 1; }
    done
'

test_expect_success "--top-k 1 is greedy at any temperature" '
    $GEN $M/g1 --prompt-ids $P -n 24 --top-k 1 --temperature 0.5 >a && diff $C/g1.greedy.ids a &&
    $GEN $M/g2 --prompt-ids $P -n 24 --top-k 1 --temperature 5 >a && diff $C/g2.greedy.ids a &&
    $GEN $M/l1 --prompt-ids $P -n 24 --top-k 1 --temperature 1 --seed 5 >a && diff $C/l1.greedy.ids a &&
    $GEN $M/l2 --prompt-ids $P -n 24 --top-k 1 --temperature 50 >a && diff $C/l2.greedy.ids a
'

test_expect_success "a seed gives the same ids every time, another seed other ids" '
    $GEN $M/g1 --prompt-ids $P -n 30 --temperature 1.5 --seed 11 >a && diff $C/g1.replay.ids a &&
    $GEN $M/g1 --prompt-ids $P -n 30 --temperature 1.5 --seed 12 >b && cat a b && ! diff -q a b >/dev/null &&
    $GEN $M/l2 --prompt-ids $P -n 30 --temperature 0.8 --top-k 20 --seed 5 >a && diff $C/l2.replay.ids a &&
    $GEN $M/l2 --prompt-ids $P -n 30 --temperature 0.8 --top-k 20 --seed 6 >b && cat a b && ! diff -q a b >/dev/null
'

test_expect_success "config.json's eos_token_id ends the output at its first occurrence; --ignore-eos does not" '
    cp -r $M/g2 g2eos && cp -r $M/l1 l1eos &&
    g=($(cat $C/g2.greedy.ids)) && l=($(cat $C/l1.greedy.ids)) &&
    $PY - g2eos/config.json ${g[4]} l1eos/config.json ${l[6]} ${l[9]} <<-EOF &&
	import json, sys
	for f, eos in ((sys.argv[1], int(sys.argv[2])), (sys.argv[3], [int(sys.argv[4]), int(sys.argv[5])])):
	    c = json.load(open(f)); c["eos_token_id"] = eos; json.dump(c, open(f, "w"))
	EOF
    $GEN g2eos --prompt-ids $P -n 24 >a && $GEN l1eos --prompt-ids $P -n 24 >b && cat a b &&
    $PY - a "${g[*]}" ${g[4]} b "${l[*]}" ${l[6]},${l[9]} <<-EOF &&
	import sys
	for out, full, eos in ((sys.argv[1], sys.argv[2], sys.argv[3]), (sys.argv[4], sys.argv[5], sys.argv[6])):
	    full, eos = full.split(), eos.split(",")
	    n = min(full.index(e) for e in eos) + 1
	    assert open(out).read().split() == full[:n], (out, full[:n])
	EOF
    $GEN g2eos --prompt-ids $P -n 24 --ignore-eos >a && diff $C/g2.greedy.ids a
'

# gencfg DIR JSON: DIR/generation_config.json holds JSON.
gencfg() { printf "%s\n" "$2" >"$1/generation_config.json"; }
# stops_at OUT FULL EOS: OUT holds the ids of FULL (space separated) up to the
# first of EOS (comma separated) that occurs, that one included.
stops_at() {
    $PY - "$1" "$2" "$3" <<-EOF
	import sys
	out, full, eos = open(sys.argv[1]).read().split(), sys.argv[2].split(), sys.argv[3].split(",")
	n = min(full.index(e) for e in eos if e in full) + 1
	assert out == full[:n], (out, full[:n])
	EOF
}
export -f gencfg stops_at

test_expect_success "generation_config.json's eos_token_id decides, as in transformers: a Llama 3 Instruct-like list ends at its end-of-turn id, which config.json lacks; -v says where the ids came from" '
    cp -r $M/l1 inst && l=($(cat $C/l1.greedy.ids)) &&
    $PY - inst/config.json ${l[12]} <<-EOF &&
	import json, sys
	c = json.load(open(sys.argv[1])); c["eos_token_id"] = int(sys.argv[2]); json.dump(c, open(sys.argv[1], "w"))
	EOF
    $GEN inst --prompt-ids $P -n 24 -v >a 2>err && cat a err && stops_at a "${l[*]}" ${l[12]} &&
    grep -qx "generate: end-of-sequence ids: ${l[12]}, from config.json.s eos_token_id" err &&
    gencfg inst "{\"bos_token_id\": 0, \"eos_token_id\": [${l[12]}, ${l[20]}, ${l[5]}], \"transformers_version\": \"4.45.0\"}" &&
    $GEN inst --prompt-ids $P -n 24 -v >b 2>err && cat b err &&
    stops_at b "${l[*]}" ${l[12]},${l[20]},${l[5]} && test $(wc -w <b) -lt $(wc -w <a) &&
    grep -qx "generate: end-of-sequence ids: ${l[12]} ${l[20]} ${l[5]}, from generation_config.json.s eos_token_id" err &&
    $GEN inst --prompt-ids $P -n 24 --ignore-eos -v >c 2>err && diff $C/l1.greedy.ids c &&
    grep -q "^generate: end-of-sequence ids: .*(not applied: --ignore-eos)\$" err &&
    g=($(cat $C/g2.greedy.ids)) && cp -r $M/g2 gpt && gencfg gpt "{\"eos_token_id\": ${g[4]}}" &&
    $GEN gpt --prompt-ids $P -n 24 >d && stops_at d "${g[*]}" ${g[4]}
'

test_expect_success "a generation_config.json without eos_token_id (or null) means no end-of-sequence id, config.json's is not used (transformers does not fall back to it)" '
    cp -r $M/g2 g && g=($(cat $C/g2.greedy.ids)) &&
    $PY - g/config.json ${g[4]} <<-EOF &&
	import json, sys
	c = json.load(open(sys.argv[1])); c["eos_token_id"] = int(sys.argv[2]); json.dump(c, open(sys.argv[1], "w"))
	EOF
    $GEN g --prompt-ids $P -n 24 >a && stops_at a "${g[*]}" ${g[4]} &&
    for j in "{\"bos_token_id\": 1, \"max_length\": 20, \"pad_token_id\": 0}" "{\"eos_token_id\": null}" "{\"eos_token_id\": []}"; do
        gencfg g "$j" && $GEN g --prompt-ids $P -n 24 -v >b 2>err && cat err &&
        diff $C/g2.greedy.ids b && grep -q "^generate: end-of-sequence ids: none, from generation_config.json" err ||
            { echo "$j"; exit 1; }
    done &&
    grep -qx "generate: end-of-sequence ids: none, from generation_config.json.s eos_token_id" err &&
    gencfg g "{}" && $GEN g --prompt-ids $P -n 3 -v 2>err >/dev/null && cat err &&
    grep -qx "generate: end-of-sequence ids: none, from generation_config.json, which has no eos_token_id (config.json.s is not used)" err &&
    $GEN $M/g1 --prompt-ids $P -n 3 -v 2>err >/dev/null && cat err &&
    grep -qx "generate: end-of-sequence ids: none, from config.json.s eos_token_id" err
'

test_expect_success "a config.json without eos_token_id has its config class's default, as from_pretrained builds it: LlamaConfig's and MistralConfig's 2 ends the output there, GPT2Config's 50256 is none in a smaller vocabulary; -v names the default" '
    $GEN $M/l1 --prompt-ids 3 -n 40 >full && cat full && grep -qw 2 full &&
    cp -r $M/l1 lnoeos && cp -r $M/l1 mnoeos && cp -r $M/g1 gnoeos && $PY - <<-EOF &&
	import json
	for d in ("lnoeos", "mnoeos", "gnoeos"):
	    c = json.load(open(d + "/config.json")); del c["eos_token_id"]
	    if d == "mnoeos":
	        c.update(model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=None)
	    json.dump(c, open(d + "/config.json", "w"))
	EOF
    for m in l:Llama m:Mistral; do
        $GEN ${m%:*}noeos --prompt-ids 3 -n 40 -v >a 2>err && cat a err && stops_at a "$(cat full)" 2 &&
        grep -qx "generate: end-of-sequence ids: 2, from ${m#*:}Config.s default (config.json has no eos_token_id)" err &&
        $GEN ${m%:*}noeos --prompt-ids 3 -n 40 --ignore-eos >b && diff full b || { echo "$m"; exit 1; }
    done &&
    $GEN gnoeos --prompt-ids $P -n 24 -v >a 2>err && cat err && diff $C/g1.greedy.ids a &&
    grep -qx "generate: end-of-sequence ids: none, from GPT2Config.s default (config.json has no eos_token_id; 50256 is outside the vocabulary)" err
'

test_expect_success "its sampling settings are not applied (greedy unless --temperature; our flags decide, and -v says so); neutral values of what would change HF's greedy tokens are accepted" '
    cp -r $M/l1 s &&
    gencfg s "{\"do_sample\": true, \"temperature\": 0.6, \"top_k\": 5, \"top_p\": 0.9, \"repetition_penalty\": 1.0, \"num_beams\": 1, \"no_repeat_ngram_size\": 0, \"suppress_tokens\": [], \"min_new_tokens\": 5, \"forced_eos_token_id\": null}" &&
    $GEN s --prompt-ids $P -n 24 -v >a 2>err && cat err && diff $C/l1.greedy.ids a &&
    grep -qx "generate: generation_config.json.s sampling settings (do_sample true, temperature 0.6, top_k 5, top_p 0.9) are not applied: generate.s own flags decide (--temperature, --top-k; greedy without them)" err &&
    $GEN s --prompt-ids $P -n 40 --temperature 3 --top-k 5 --seed 3 >b && diff $C/l1.topk.ids b &&
    $GEN s --prompt-ids $P -n 30 --temperature 1 --top-k 7 --seed 18446744073709551615 >c && diff $C/l1.replay.ids c
'

test_expect_success "a generation_config.json that is malformed, has a wrong type, or asks for what changes HF's greedy tokens is refused: one line naming the file and the key, exit 1, no ids" '
    cp -r $M/l1 bad && bad=0 &&
    while IFS="|" read -r json msg; do
        [ -n "$json" ] || continue
        gencfg bad "$json" && rc=0 && $GEN bad --prompt-ids $P -n 3 >out 2>err || rc=$?
        if [ $rc -ne 1 ] || [ -s out ] || [ "$(cat err)" != "generate: bad/generation_config.json: $msg" ]; then
            echo "$json: exit $rc (want 1), stdout $(wc -c <out) bytes, stderr:"; cat err
            echo "want: generate: bad/generation_config.json: $msg"; bad=1
        fi
    done <<-EOF &&
	{"eos_token_id": 2,|not valid JSON: string or '"'"'}'"'"' expected near end of file (line 2)
	{"eos_token_id": 2, "eos_token_id": 3}|not valid JSON: duplicate object key near '"'"'"eos_token_id"'"'"' (line 1)
	[2]|malformed: a JSON object is needed, not an array
	{"eos_token_id": "2"}|malformed: "eos_token_id" must be an integer, a list or null, not a string
	{"eos_token_id": [2, 3.0]}|malformed: eos_token_id[1] must be a token id, not a real number
	{"eos_token_id": [2, 101]}|eos_token_id 101 is not a token of the vocabulary [0, 101)
	{"eos_token_id": -1}|eos_token_id -1 is not a token of the vocabulary [0, 101)
	{"eos_token_id": [1, 2, 3, 4, 5, 6, 7, 8, 9]}|eos_token_id lists 9 tokens; at most 8
	{"do_sample": "yes"}|malformed: "do_sample" must be true, false or null, not a string
	{"temperature": [0.6]}|malformed: "temperature" must be a number or null, not an array
	{"top_k": 5.5}|malformed: "top_k" must be an integer or null, not a real number
	{"repetition_penalty": "1.1"}|malformed: "repetition_penalty" must be a number or null, not a string
	{"repetition_penalty": 1.1}|repetition_penalty is 1.1: a repetition penalty, which transformers'"'"' generate() applies and generate does not (the tokens would differ); supported: 1.0 or null
	{"no_repeat_ngram_size": 3}|no_repeat_ngram_size is 3: a ban on repeated n-grams, which transformers'"'"' generate() applies and generate does not (the tokens would differ); supported: 0 or null
	{"num_beams": 4}|num_beams is 4: beam search, which transformers'"'"' generate() applies and generate does not (the tokens would differ); supported: 1 or null
	{"eos_token_id": 2, "min_new_tokens": 5}|min_new_tokens is 5: a minimum length: the end-of-sequence ids masked before it, which transformers'"'"' generate() applies and generate does not (the tokens would differ); supported: 0 or null
	{"suppress_tokens": [1, 2]}|suppress_tokens is [1,2]: suppressed tokens, which transformers'"'"' generate() applies and generate does not (the tokens would differ); supported: null
	{"forced_eos_token_id": 2}|forced_eos_token_id is 2: a forced last token, which transformers'"'"' generate() applies and generate does not (the tokens would differ); supported: null
	EOF
    test $bad -eq 0 &&
    rm bad/generation_config.json && mkfifo bad/generation_config.json &&
    rc=0 && with_timeout 10 $GEN bad --prompt-ids 1 >out 2>err || rc=$? &&
    cat err && test $rc -eq 1 && test ! -s out &&
    test "$(cat err)" = "generate: bad/generation_config.json: not a regular file (a generation_config.json is a JSON text file)" &&
    rm bad/generation_config.json && mkdir bad/generation_config.json &&
    rc=0 && $GEN bad --prompt-ids 1 >out 2>err || rc=$? && cat err && test $rc -eq 1 &&
    grep -q "^generate: bad/generation_config.json: not a regular file" err &&
    mock=$BUILDDIR/tests/mock/generate-cuda-mock && if [ -x $mock ]; then
        rmdir bad/generation_config.json && gencfg bad "{\"num_beams\": 4}" &&
        rc=0 && $mock bad --prompt-ids 1 --device cuda >out 2>err || rc=$? && cat err &&
        test $rc -eq 1 && grep -q "^generate: bad/generation_config.json: num_beams is 4: beam search" err
    fi
'

# cfgset DIR PYTHON: config.json of DIR changed by PYTHON (on the dict c).
cfgset() {
    $PY - "$1/config.json" "$2" <<-EOF
	import json, sys
	c = json.load(open(sys.argv[1])); exec(sys.argv[2]); json.dump(c, open(sys.argv[1], "w"))
	EOF
}
export -f cfgset

test_expect_success "without a generation_config.json, config.json's generation settings are the ones transformers applies (GenerationConfig.from_model_config): what would change HF's greedy tokens is refused there too, neutral values read, the sampling settings are named by -v; with the file they count for nothing" '
    cp -r $M/l1 legacy && cp -r $M/g1 glegacy && bad=0 &&
    while IFS="|" read -r dir set msg; do
        [ -n "$dir" ] || continue
        rm -rf c.$dir && cp -r $dir c.$dir && cfgset c.$dir "$set" &&
        rc=0 && $GEN c.$dir --prompt-ids $P -n 3 >out 2>err || rc=$?
        if [ $rc -ne 1 ] || [ -s out ] || [ "$(cat err)" != "generate: c.$dir/config.json: $msg" ]; then
            echo "$dir $set: exit $rc (want 1), stdout $(wc -c <out) bytes, stderr:"; cat err
            echo "want: generate: c.$dir/config.json: $msg"; bad=1
        fi
    done <<-EOF &&
	legacy|c["repetition_penalty"] = 1.3|repetition_penalty is 1.3: a repetition penalty, which transformers'"'"' generate() applies and generate does not (the tokens would differ); supported: 1.0 or null
	glegacy|c["no_repeat_ngram_size"] = 3|no_repeat_ngram_size is 3: a ban on repeated n-grams, which transformers'"'"' generate() applies and generate does not (the tokens would differ); supported: 0 or null
	glegacy|c["num_beams"] = 4|num_beams is 4: beam search, which transformers'"'"' generate() applies and generate does not (the tokens would differ); supported: 1 or null
	legacy|c["eos_token_id"] = 5; c["min_length"] = 30|min_length is 30: a minimum length: the end-of-sequence ids masked before it, which transformers'"'"' generate() applies and generate does not (the tokens would differ); supported: 0 or null
	legacy|del c["eos_token_id"]; c["min_new_tokens"] = 30|min_new_tokens is 30: a minimum length: the end-of-sequence ids masked before it, which transformers'"'"' generate() applies and generate does not (the tokens would differ); supported: 0 or null
	legacy|c["temperature"] = "hot"|malformed: "temperature" must be a number or null, not a string
	EOF
    test $bad -eq 0 &&
    cfgset legacy "c.update(min_length=30, repetition_penalty=1.0, num_beams=1, do_sample=True, temperature=0.7, forced_eos_token_id=None)" &&
    $GEN legacy --prompt-ids $P -n 24 -v >a 2>err && cat err && diff $C/l1.greedy.ids a &&
    grep -qx "generate: config.json.s sampling settings (do_sample true, temperature 0.7) are not applied: generate.s own flags decide (--temperature, --top-k; greedy without them)" err &&
    cfgset legacy "c.update(repetition_penalty=1.3, num_beams=4)" && test_must_fail $GEN legacy --prompt-ids $P -n 3 &&
    gencfg legacy "{}" && $GEN legacy --prompt-ids $P -n 24 -v >b 2>err && cat err && diff $C/l1.greedy.ids b &&
    ! grep -q "sampling settings" err
'

test_expect_success "on the trainers' checkpoints: greedy equals the oracle token for token, sampled logits within 1e-5" '
    same ck-llama && same ck-gpt2 && logits_ok ck-llama.sampled && logits_ok ck-gpt2.sampled
'

# ------------------------------------------------------------ the CUDA decoder

MOCK=$BUILDDIR/tests/mock/generate-cuda-mock
export MOCK
if [ -x "$MOCK" ]; then
    test_expect_success "the CUDA decoder's host code (decode_cuda.c) on a CPU emulation of nn's CUDA layers (tests/mock, bf16): logits along each greedy path within 8e-2 of the oracle's (3e-2 mean), ids the oracle's up to its first gap <= 0.5, a prefill of two chunks" '
        for c in g1:$P:24 g2:$P:24 l1:$P:24 l2:$P:24 l1:$LONG:30; do
            IFS=: read -r m prompt n <<<"$c"
            $MOCK $M/$m --prompt-ids $prompt -n $n --device cuda --dump-logits $m.$n.dump \
                >$m.$n.ids || exit 1
            echo "$m.$n.logits logits $M/$m $prompt $(tr " " , <$m.$n.ids) $PWD/$m.$n.dump 8e-2"
            echo "$m.$n.follows follows $M/$m $prompt $(tr " " , <$m.$n.ids) 0.5"
        done >batch &&
        with_timeout 120 $PY "$ORACLE" batch batch >res && cat res &&
        test $(grep -c " ok\$" res) -eq 10 && awk "\$2 == \"logits\" && \$5 > 3e-2 { exit 1 }" res
    '
fi

if ! nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then
    test_expect_success "--device cuda without a GPU (or without CUDA): one line, no ids, exit 1" '
        rc=0 && $GEN $M/l1 --prompt-ids $P -n 3 --device cuda >out 2>err || rc=$? &&
        cat err && test $rc -eq 1 && test ! -s out && test $(wc -l <err) -eq 1 &&
        grep -q "^generate: --device cuda: " err
    '
fi

# ------------------------------------------------------------ bad input

test_expect_success "bad input: one line on stderr, no ids, exit 2 (command line) or 1 (files, a non-finite logit)" '
    mkdir empty && cp -r $M/l1 nohead && cp -r $M/l1 bert && cp -r $M/g1 shape && cp -r $M/g1 nan &&
    $PY - <<-EOF &&
	import json, sys
	sys.path.insert(0, "$SRC/tests/tools")
	import generate_oracle as o
	t = o.read_model("nohead"); t.pop("lm_head.weight")
	o.write_safetensors("nohead/model.safetensors", t, "F32")
	t = o.read_model("shape")
	for l in range(3):
	    t["transformer.h.%d.mlp.c_fc.bias" % l] = t["transformer.h.%d.mlp.c_fc.bias" % l][:100]
	o.write_safetensors("shape/model.safetensors", t, "F32")
	c = json.load(open("bert/config.json")); c["model_type"] = "bert"; json.dump(c, open("bert/config.json", "w"))
	t = o.read_model("nan"); t["transformer.ln_f.bias"][5] = float("nan")
	o.write_safetensors("nan/model.safetensors", t, "F32")
	EOF
    bad=0 &&
    while IFS="|" read -r code msg args; do
        [ -n "$code" ] || continue
        rc=0 && eval "$GEN $args" >out 2>err || rc=$?
        if [ $rc -ne $code ] || [ -s out ] || [ "$(cat err)" != "generate: $msg" ]; then
            echo "generate $args: exit $rc (want $code), stdout $(wc -c <out) bytes, stderr:"; cat err
            echo "want: generate: $msg"; bad=1
        fi
    done <<-EOF &&
	2|no model directory (generate DIR --prompt-ids ...; --help)|
	2|no prompt: give --prompt-ids or --prompt|$M/g1
	2|--prompt-ids and --prompt: give one prompt|$M/g2 --prompt-ids 1 --prompt x
	2|--prompt-ids is given twice: give one prompt (its ids comma separated)|$M/g1 --prompt-ids 1,2 --prompt-ids 3
	2|--prompt is given twice: give one prompt|$M/g2 --prompt ab --prompt c
	2|-n needs an integer from 1 to 16777216, not '"'"'abc'"'"'|$M/g1 --prompt-ids 1 -n abc
	2|-n needs an integer from 1 to 16777216, not '"'"'0'"'"'|$M/g1 --prompt-ids 1 -n 0
	2|--temperature needs a number >= 0, not '"'"'-1'"'"'|$M/g1 --prompt-ids 1 --temperature -1
	2|--temperature needs a number >= 0, not '"'"'nan'"'"'|$M/g1 --prompt-ids 1 --temperature nan
	2|--top-k needs an integer from 0 to 2147483647, not '"'"'-3'"'"'|$M/g1 --prompt-ids 1 --top-k -3
	2|--top-k 5 samples, and temperature 0 (the default) is greedy: give --temperature X > 0 as well, or drop --top-k|$M/g1 --prompt-ids 1 --top-k 5
	2|--seed needs an unsigned 64-bit integer, not '"'"'-1'"'"'|$M/g1 --prompt-ids 1 --seed -1
	2|--seed needs an unsigned 64-bit integer, not '"'"'18446744073709551616'"'"'|$M/g1 --prompt-ids 1 --seed 18446744073709551616
	2|--prompt-ids needs token ids separated by commas ("1,2,3"), not '"'"'1,,2'"'"'|$M/g1 --prompt-ids 1,,2
	2|--prompt-ids needs token ids separated by commas ("1,2,3"), not '"'"'1,x'"'"'|$M/g1 --prompt-ids 1,x
	2|--prompt-ids: token 12345678901 is too large|$M/g1 --prompt-ids 1,0012345678901
	2|--temperature 1e-320 is too small for a double; use 0 for greedy decoding|$M/g1 --prompt-ids 1 --temperature 1e-320
	2|--prompt is empty: give at least one byte|$M/g2 --prompt ""
	2|unknown option '"'"'--bogus'"'"' (generate --help)|$M/g1 --bogus
	2|--top-k needs a value|$M/g1 --prompt-ids 1 --top-k
	2|--device needs cpu or cuda, not '"'"'gpu'"'"'|$M/g1 --prompt-ids 1 --device gpu
	2|one model directory, not several ('"'"'$M/g1'"'"' and '"'"'$M/g2'"'"')|$M/g1 $M/g2 --prompt-ids 1
	2|--prompt-ids: token 97 (number 3) is outside the vocabulary [0, 97) of $M/g1|$M/g1 --prompt-ids 1,2,97
	2|--prompt encodes bytes as tokens, for byte-level models (vocab_size 256); $M/l1 has vocab_size 101: use --prompt-ids|$M/l1 --prompt hello
	2|--text encodes bytes as tokens, for byte-level models (vocab_size 256); $M/g1 has vocab_size 97: use --prompt-ids and print the ids|$M/g1 --prompt-ids 1 --text
	2|a prompt of 7 tokens and -n 58 make 65 positions; the model has 64 (n_positions)|$M/g1 --prompt-ids $P -n 58
	2|a prompt of 70 tokens and -n 59 make 129 positions; the model has 128 (max_position_embeddings)|$M/l1 --prompt-ids $LONG -n 59
	1|nowhere: No such file or directory|nowhere --prompt-ids 1
	1|empty/config.json: no such file: a model directory needs its config.json|empty --prompt-ids 1
	1|bert/config.json: model_type is "bert"; supported: "gpt2", "llama", "mistral" (the models generate runs)|bert --prompt-ids 1
	1|nohead has no tensor '"'"'lm_head.weight'"'"'|nohead --prompt-ids 1
	1|shape/model.safetensors: tensor '"'"'transformer.h.0.mlp.c_fc.bias'"'"' is (100); the model needs (192)|shape --prompt-ids 1
	EOF
    test $bad -eq 0 &&
    $GEN $M/g1 --prompt-ids $P -n 57 >out && test $(wc -w <out) -eq 57 &&
    $GEN $M/g1 --prompt-ids 00000000001,02 -n 5 >a && $GEN $M/g1 --prompt-ids 1,2 -n 5 >b && cmp a b &&
    { $GEN nan --prompt-ids $P >out 2>err; rc=$?; } && cat err && test $rc -eq 1 && test ! -s out &&
    test "$(sed "s/is -nan/is nan/" err)" = "generate: the logit of token 0 after position 6 is nan: the model'"'"'s weights or activations are not finite"
'

test_expect_success "a FIFO named config.json or latest is refused at once (exit 1, one line), never waited on" '
    mkdir fifocfg fifolatest && mkfifo fifocfg/config.json fifolatest/latest &&
    rc=0 && with_timeout 10 $GEN fifocfg --prompt-ids 1 >out 2>err || rc=$? &&
    cat err && test $rc -eq 1 && test ! -s out &&
    test "$(cat err)" = "generate: fifocfg/config.json: not a regular file (a config.json is a JSON text file)" &&
    rc=0 && with_timeout 10 $GEN fifolatest --prompt-ids 1 >out 2>err || rc=$? &&
    cat err && test $rc -eq 1 && test ! -s out &&
    grep -q "^generate: fifolatest/latest: not a regular file" err &&
    mkdir dircfg dircfg/config.json && rc=0 && $GEN dircfg --prompt-ids 1 >out 2>err || rc=$? &&
    cat err && test $rc -eq 1 && grep -q "^generate: dircfg/config.json: not a regular file" err
'

test_expect_success "output that cannot be written (a full disk, a closed stdout) is exit 1 with one line, --help's too; a pipe nobody reads kills it by SIGPIPE (exit 1 when SIGPIPE is ignored), never exit 0" '
    for how in ">/dev/full" ">&-"; do
        rc=0 && eval "$GEN $M/g1 --prompt-ids $P -n 5 $how" 2>err || rc=$? &&
        cat err && test $rc -eq 1 && test $(wc -l <err) -eq 1 && grep -q "^generate: stdout: " err &&
        rc=0 && eval "$GEN --help $how" 2>err || rc=$? &&
        cat err && test $rc -eq 1 && test $(wc -l <err) -eq 1 && grep -q "^generate: stdout: " err ||
        exit 1
    done &&
    $GEN --help >out && grep -q "^usage: generate DIR" out &&
    for ign in 0 1; do # a pipe nobody reads: killed by SIGPIPE, or exit 1 when it is ignored
        $PY - $ign $GEN $M/g1 --prompt-ids $P -n 5 <<-EOF || exit 1
	import os, subprocess, sys
	r, w = os.pipe()
	os.close(r)  # before the start: the first write fails, whenever it comes
	# restore_signals=False: the SIG_IGN of SIGPIPE that Python sets is inherited
	p = subprocess.run(sys.argv[2:], stdout=w, stderr=subprocess.PIPE, restore_signals=sys.argv[1] == "0")
	print(p.returncode, p.stderr)
	assert (p.returncode, p.stderr) == ((-13, b"") if sys.argv[1] == "0" else (1, b"generate: stdout: Broken pipe\n"))
	EOF
    done
'

test_expect_success "a config.json as transformers 5 writes it (rope_parameters: rope_theta and Llama 3 scaling) gives the same ids and logits" '
    cp -r $M/l1 v5 && $PY - <<-EOF &&
	import json
	c = json.load(open("v5/config.json"))
	p = dict(c.pop("rope_scaling")); p["rope_theta"] = c.pop("rope_theta")
	c["rope_parameters"] = p; c["dtype"] = c.pop("torch_dtype"); json.dump(c, open("v5/config.json", "w"))
	EOF
    cat v5/config.json && $GEN v5 --prompt-ids $P -n 24 --dump-logits v5.dump >out &&
    diff $C/l1.greedy.ids out && cmp $C/l1.greedy.dump v5.dump &&
    $PY - <<-EOF &&
	import json
	c = json.load(open("v5/config.json")); c["rope_parameters"]["rope_theta"] = 10000.0
	json.dump(c, open("v5/config.json", "w"))
	EOF
    $GEN v5 --prompt-ids $P -n 24 --dump-logits v5.dump >out && ! cmp -s $C/l1.greedy.dump v5.dump
'

test_expect_success "a directory holding model.safetensors and an index is read through model.safetensors, as transformers reads it: generate equals the oracle there, not the index's model" '
    cp -r $M/l2 both && test -f both/model.safetensors.index.json &&
    $PY "$ORACLE" make other --model llama --layers 3 --embd 64 --heads 4 --kv 4 --head-dim 16 \
        --ffn 128 --vocab 256 --max-pos 64 --tied 1 --dtype bf16 --seed 4 &&
    cp other/model.safetensors both/ &&
    $GEN both --prompt-ids $P -n 24 >a && ! diff -q $C/l2.greedy.ids a >/dev/null &&
    echo "both greedy $PWD/both $P 24" >batch && with_timeout 60 $PY "$ORACLE" batch batch >res &&
    cat a res && test "$(sed -n "s/^both ids \(.*\) gap .*/\1/p" res)" = "$(cat a)"
'

test_expect_success "a mistral config.json without sliding_window (MistralConfig: a window of 4096) is refused" '
    cp -r $M/l1 mis && $PY - <<-EOF &&
	import json
	c = json.load(open("mis/config.json")); c["model_type"] = "mistral"; c["architectures"] = ["MistralForCausalLM"]
	c.pop("sliding_window", None); json.dump(c, open("mis/config.json", "w"))
	EOF
    rc=0 && $GEN mis --prompt-ids $P -n 3 >out 2>err || rc=$? && cat err && test $rc -eq 1 &&
    test ! -s out && grep -q "sliding_window is absent, which MistralConfig takes as 4096" err &&
    $PY - <<-EOF &&
	import json
	c = json.load(open("mis/config.json")); c["sliding_window"] = None; json.dump(c, open("mis/config.json", "w"))
	EOF
    $GEN mis --prompt-ids $P -n 24 >out && diff $C/l1.greedy.ids out
'

test_done
