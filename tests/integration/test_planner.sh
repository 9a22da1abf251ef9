#!/bin/bash
# The planner's cost model through bmlaunch (--plan --model): the defaults are
# the fit of the recorded bench/comm table; the JSON's schema and its
# invariants; the issue's 20x50 question answered; options move the figures the
# way they must; the worked examples in docs/slurm.md and docs/planner.md are
# what bmlaunch prints; the predicted-vs-measured table of docs/planner.md is
# what bench/planner_check.sh prints.
. "$(dirname "$0")/lib.sh"

test_expect_success "bench/comm_fit.py on the recorded 2x H200 table gives costmodel.h's defaults" '
    /usr/bin/python3 "$SRC/bench/comm_fit.py" "$SRC/bench/results/2026-11-30-comm-nccl-2xH200.txt" >fit &&
    cat fit &&
    def() { sed -n "s/^#define $1 \([0-9.]*\)$/\1/p" "$SRC/launcher/costmodel.h"; } &&
    test "$(awk "/^all_gather/ { print \$3 }" fit)" = "$(def COSTMODEL_NVLINK_AG_GBPS)" &&
    test "$(awk "/^reduce_scatter/ { print \$3 }" fit)" = "$(def COSTMODEL_NVLINK_RS_GBPS)" &&
    test "$(awk "/^all_reduce/ { print \$3 }" fit)" = "$(def COSTMODEL_NVLINK_AR_GBPS)" &&
    test "$(awk "/^call_simple_us/ { print \$2 }" fit)" = "$(def COSTMODEL_CALL_SIMPLE_US)" &&
    test "$(awk "/^call_ll_us/ { print \$2 }" fit)" = "$(def COSTMODEL_CALL_LL_US)" &&
    # every fitted line within 5% of every size it was fitted to
    awk "/worst residual/ { v = \$8; sub(/%/, \"\", v); if (v + 0 > 5) bad = 1 } END { exit bad }" fit
'

test_expect_success "bench/comm_fit.py refuses what is not a bench/comm table" '
    echo "hello" >notatable &&
    test_must_fail /usr/bin/python3 "$SRC/bench/comm_fit.py" notatable 2>err &&
    grep -q "not a bench/comm table" err &&
    test_must_fail /usr/bin/python3 "$SRC/bench/comm_fit.py" "$SRC/bench/results/2026-11-30-comm-nccl-2xH200.txt" --min 2>err &&
    grep -q "need a number of bytes" err
'

test_expect_success "--plan --json: the cost_model schema and its invariants (checked by python)" '
    $BMLAUNCH --plan --json --model llama3-70b -g 20 -n 50 --gpus-per-node 8 >plan.json &&
    /usr/bin/python3 - plan.json <<-PY
	import json, sys
	p = json.load(open(sys.argv[1]))
	assert p["groups"] == 20 and p["world"] == 1000  # the layout keys are still there
	c = p["cost_model"]
	assert set(c) == {"model", "train", "gpu", "links", "layouts", "recommended"}, set(c)
	m = c["model"]
	assert m["name"] == "llama3-70b" and m["params"] == 70553706496 and m["layers"] == 80, m
	t = c["train"]
	assert (t["seq"], t["micro_batch"], t["accum"], t["ckpt"], t["zero_level"]) == (4096, 1, 1, True, 3), t
	L = c["layouts"]
	assert [l["rank"] for l in L] == list(range(1, len(L) + 1))
	assert sum(l["yours"] for l in L) == 1
	keys = {"rank", "groups", "gpus_per_group", "gpus_per_node", "nodes", "world", "why", "yours",
	        "step_s", "compute_s", "exposed_s", "exposed_group_s", "exposed_replica_s", "comm_busy_s",
	        "replica_busy_s", "tokens_per_s", "mfu", "memory_bytes", "collectives"}
	fits = [l for l in L if l["memory_bytes"]["fits"]]
	for l in L:
	    assert set(l) == keys, set(l) ^ keys
	    assert l["groups"] * l["gpus_per_group"] == l["world"] and l["gpus_per_node"] == 8
	    assert abs(l["step_s"] - l["compute_s"] - l["exposed_s"]) < 1e-9
	    assert abs(l["exposed_s"] - l["exposed_group_s"] - l["exposed_replica_s"]) < 1e-9
	    assert l["exposed_s"] >= 0 and 0 < l["mfu"] < 1
	    mb = l["memory_bytes"]
	    parts = ["states", "grad_shards", "activations", "transient", "gathered", "grad_full", "workspace"]
	    assert mb["peak"] <= sum(mb[k] for k in parts) + 1 and mb["fits"] == (mb["peak"] <= mb["usable"])
	    for r in l["collectives"]:
	        assert r["algorithm"] in ("ring", "tree", "pat") and r["protocol"] in ("LL", "LL128", "Simple")
	        assert r["calls"] >= 1 and r["seconds"] > 0 and r["ranks"] >= 2
	        if r["algorithm"] == "pat":
	            assert r["collective"] != "all-reduce" and r["ranks"] == r["nodes"]
	        if r["algorithm"] == "tree":
	            assert r["collective"] == "all-reduce"
	# the fitting layouts first, by step time; then the rest by peak memory
	assert L[:len(fits)] == fits
	assert all(a["step_s"] <= b["step_s"] for a, b in zip(fits, fits[1:]))
	rest = L[len(fits):]
	assert all(a["memory_bytes"]["peak"] <= b["memory_bytes"]["peak"] for a, b in zip(rest, rest[1:]))
	r = c["recommended"]
	best = [l for l in fits if l["world"] == 1000][0]
	assert (r["groups"], r["gpus_per_group"]) == (best["groups"], best["gpus_per_group"]), r
	assert r["is_yours"] is False and r["keep_yours"] is False and r["faster_than_yours"] > 0.05
	assert r["deciding"][0]["term"] == "exposed group communication"
	yours = [l for l in L if l["yours"]][0]
	assert yours["collectives"][0]["thinnest"] == 2 and yours["collectives"][0]["busbw_gbps"] == 92.0
	PY
'

test_expect_success "the options move the figures the way they must" '
    j() { $BMLAUNCH --plan --json -g 20 -n 50 --gpus-per-node 8 "$@"; } &&
    j --model 70B >base.json &&
    j --model 70B --ckpt 0 >nockpt.json &&
    j --model 70B --micro-batch 4 >b4.json &&
    j --model 70B --nic-busbw 400 >fastnic.json &&
    j --model 70B --busbw-group 400 >fastgroup.json &&
    j --model 70B --latency-us 100 >slowstep.json &&
    j --model 70B --mfu 0.9 >mfu.json &&
    j --model 70B --gpu h100 >h100.json &&
    j --model 70B --accum 4 >accum.json &&
    j --model 70B --keep-attention 0 >nokeep.json &&
    /usr/bin/python3 - <<-PY
	import json
	def y(f):
	    return [l for l in json.load(open(f))["cost_model"]["layouts"] if l["yours"]][0]
	b = y("base.json")
	# checkpointed, every layer keeps its input and (--keep-attention 1) its
	# attention output: about twice the input alone, a fraction of everything
	nk = y("nokeep.json")
	assert y("nockpt.json")["memory_bytes"]["activations"] > 10 * nk["memory_bytes"]["activations"]
	assert 1.9 < b["memory_bytes"]["activations"] / nk["memory_bytes"]["activations"] < 2.1
	assert y("nockpt.json")["compute_s"] < b["compute_s"] < nk["compute_s"]  # the recomputation, less the attention
	assert abs(y("b4.json")["compute_s"] / b["compute_s"] - 4) < 0.01
	assert y("fastnic.json")["exposed_group_s"] < b["exposed_group_s"] / 5
	assert y("fastgroup.json")["exposed_group_s"] < b["exposed_group_s"] / 5
	assert y("slowstep.json")["comm_busy_s"] > b["comm_busy_s"] + 71 * 3 * 49 * 90e-6
	assert abs(y("mfu.json")["compute_s"] * 2 - b["compute_s"]) < 1e-6
	assert y("h100.json")["memory_bytes"]["usable"] < 80 * 2**30
	a = y("accum.json")
	calls = {r["op"]: r["calls"] for r in a["collectives"]}
	assert calls["gather params (forward)"] == 4 * 71 and calls["all-reduce grad shards"] == 71
	PY
'

# --ckpt-budget: the trainers' choice (the last layers whose sets fit are
# kept, then the head's whole logits): no layer kept is --ckpt 1, every layer
# kept is --ckpt 0's compute; between, the step and the memory between.
# Llama 3.2 1B at B 2 x T 4096: a layer's set is the trainer's
# (llama_cu_act_bytes), 8192 tokens x (2 x (4 C + 2 kv + 3 F) + 8) =
# 553,713,664 bytes (528.1 MiB, what the trainer prints on an H200), so 3000
# MiB keep 5 layers, 3168 MiB (6 x 528.06) 5 and 3169 MiB 6.
test_expect_success "--ckpt-budget: 0 is --ckpt 1, every layer kept is --ckpt 0's compute, 5 of 16 layers between; refused without --ckpt 1, negative, not a number" '
    j() { $BMLAUNCH --plan --json -g 1 -n 1 --model llama3.2-1b --seq-len 4096 --micro-batch 2 "$@"; } &&
    j >ck1.json && j --ckpt 0 >ck0.json && j --ckpt-budget 0 >b0.json && j --ckpt-budget 3000 >b3000.json &&
    j --ckpt-budget 100000 >ball.json && j --ckpt-budget 3168 >b3168.json && j --ckpt-budget 3169 >b3169.json &&
    /usr/bin/python3 - <<-PY &&
	import json
	def y(f):
	    c = json.load(open(f))["cost_model"]
	    return c["train"], [l for l in c["layouts"] if l["yours"]][0]
	t1, c1 = y("ck1.json"); t0, c0 = y("ck0.json")
	tb0, b0 = y("b0.json"); tb, b = y("b3000.json"); ta, a = y("ball.json")
	assert t1["ckpt_budget_mib"] is None and t1["kept_layers"] == 0 and not t1["head_whole"], t1
	assert tb0["ckpt_budget_mib"] == 0 and tb0["kept_layers"] == 0
	assert b0["compute_s"] == c1["compute_s"] and b0["memory_bytes"] == c1["memory_bytes"]
	assert tb["ckpt_budget_mib"] == 3000 and tb["kept_layers"] == 5 and not tb["head_whole"], tb
	assert y("b3168.json")[0]["kept_layers"] == 5 and y("b3169.json")[0]["kept_layers"] == 6
	assert c0["compute_s"] < b["compute_s"] < c1["compute_s"]
	layer = 553713664
	assert b["memory_bytes"]["activations"] - c1["memory_bytes"]["activations"] == 5 * layer
	# each kept layer saves one forward of a layer: a sixteenth of the recomputation
	assert abs((c1["compute_s"] - b["compute_s"]) / (c1["compute_s"] - c0["compute_s"]) - 5 / 16) < 1e-9
	assert ta["kept_layers"] == 16 and ta["head_whole"], ta
	assert abs(a["compute_s"] - c0["compute_s"]) < 1e-12
	assert a["memory_bytes"]["transient"] == c0["memory_bytes"]["transient"]  # whole logits, no block recomputed
	PY
    $BMLAUNCH --plan -g 1 -n 1 --model llama3.2-1b --seq-len 4096 --micro-batch 2 --ckpt-budget 3000 >out &&
    grep -q "checkpointing on within 3000.0 MiB; ZeRO-3" out &&
    grep -q "^    --ckpt-budget: the last 5 of 16 layers keep their activations (528.1 MiB each), the head recomputes its logits a chunk at a time" out &&
    grep -q "activations [0-9.]* (checkpointed, 5 layers kept)" out &&
    test_must_fail $BMLAUNCH --plan -g 1 -n 1 --model d48 --ckpt 0 --ckpt-budget 5 2>err &&
    grep -q "^bmlaunch: --ckpt-budget chooses which layers checkpointing spares: it needs --ckpt 1" err &&
    test_must_fail $BMLAUNCH --plan -g 1 -n 1 --model d48 --ckpt 0 --keep-attention 0 2>err &&
    grep -q "^bmlaunch: --keep-attention chooses what checkpointing.s recomputation skips: it needs --ckpt 1" err &&
    test_must_fail $BMLAUNCH --plan -g 1 -n 1 --model d48 --keep-attention 2 2>err &&
    grep -q "^bmlaunch: --keep-attention must be 0 or 1, got .2." err &&
    $BMLAUNCH --plan -g 1 -n 1 --model llama3.2-1b --seq-len 4096 --micro-batch 2 --ckpt-budget 3000 --keep-attention 0 >out &&
    grep -q "^    --ckpt-budget: the last 5 of 16 layers keep their activations (561.1 MiB each)" out &&
    test_must_fail $BMLAUNCH --plan -g 1 -n 1 --model d48 --ckpt-budget -1 2>err &&
    grep -q "^bmlaunch: --ckpt-budget needs a non-negative number of MiB, got .-1." err &&
    test_must_fail $BMLAUNCH --plan -g 1 -n 1 --model d48 --ckpt-budget lots 2>err &&
    grep -q "^bmlaunch: --ckpt-budget needs a non-negative number of MiB, got .lots." err
'

# --fp8 1: the layers' products (Llama 3.2 1B: 2 (2 C^2 + 2 C kv + 3 C F) =
# 121,634,816 FLOPs a token) at 1/1.30 of their bf16 time, forward, backward
# and recomputation; each layer's set holds codes: C + F = 10,240 bytes a
# token less, its 60,817,408 weight codes more, so the set is 530,644,992
# bytes (506.1 MiB) and 3037 MiB keep 6 layers where bf16 keeps 5.
test_expect_success "--fp8: the products faster by --fp8-speedup, the sets as the trainers hold them, refusals" '
    j() { $BMLAUNCH --plan --json -g 1 -n 1 --model llama3.2-1b --seq-len 4096 --micro-batch 2 "$@"; } &&
    j --ckpt 0 >b0.json && j --ckpt 0 --fp8 1 >f0.json && j --ckpt 1 >b1.json && j --ckpt 1 --fp8 1 >f1.json &&
    j --ckpt 0 --fp8 1 --fp8-speedup 1 >s1.json && j --ckpt 0 --fp8 1 --fp8-speedup 2 >s2.json &&
    j --ckpt-budget 3037 >bb.json && j --ckpt-budget 3037 --fp8 1 >fb.json &&
    /usr/bin/python3 - <<-PY &&
	import json
	def y(f):
	    c = json.load(open(f))["cost_model"]
	    return c["train"], [l for l in c["layouts"] if l["yours"]][0]
	C, kv, F, L, tokens = 2048, 512, 8192, 16, 8192
	product = 2 * (2 * C * C + 2 * C * kv + 3 * C * F)
	assert product == 121634816
	flops_s = 989e12 * 0.45
	def close(a, b):
	    return abs(a - b) <= 1e-9 * max(abs(a), abs(b))
	tb0, b0 = y("b0.json"); tf0, f0 = y("f0.json")
	assert tb0["fp8"] is False and tb0["fp8_speedup"] is None, tb0
	assert tf0["fp8"] is True and tf0["fp8_speedup"] == 1.3, tf0
	# without checkpointing: forward and backward, 3 passes of the products
	cut = 1 - 1 / 1.3
	assert close(b0["compute_s"] - f0["compute_s"], 3 * L * product * tokens * cut / flops_s)
	# checkpointed: a fourth pass, the recomputation (the attention kept)
	_, b1 = y("b1.json"); _, f1 = y("f1.json")
	assert close(b1["compute_s"] - f1["compute_s"], 4 * L * product * tokens * cut / flops_s)
	# a speed-up of 1 is bf16 time, 2 halves the products
	_, s1 = y("s1.json"); _, s2 = y("s2.json")
	assert s1["compute_s"] == b0["compute_s"]
	assert close(b0["compute_s"] - s2["compute_s"], 3 * L * product * tokens * 0.5 / flops_s)
	# memory: every layer keeps its set, codes instead of bf16
	d = L * (product / 2 - tokens * (C + F))
	assert f0["memory_bytes"]["activations"] - b0["memory_bytes"]["activations"] == d, d
	# checkpointed without a budget: only the input and attention stay
	assert f1["memory_bytes"]["activations"] == b1["memory_bytes"]["activations"]
	# the transient is one recomputed set (larger than a 256 MiB chunk of logits)
	assert (b1["memory_bytes"]["transient"], f1["memory_bytes"]["transient"]) == (553713664, 530644992)
	tbb, _ = y("bb.json"); tfb, fb = y("fb.json")
	assert tbb["kept_layers"] == 5 and tfb["kept_layers"] == 6, (tbb, tfb)
	assert fb["memory_bytes"]["activations"] - f1["memory_bytes"]["activations"] == 6 * 530644992
	PY
    $BMLAUNCH --plan -g 1 -n 1 --model llama3.2-1b --seq-len 4096 --micro-batch 2 --ckpt-budget 3037 --fp8 1 >out &&
    grep -q "^    --fp8 1: the layers.* linear products in FP8 at 1.30x their bf16 speed" out &&
    grep -q "^    --ckpt-budget: the last 6 of 16 layers keep their activations (506.1 MiB each)" out &&
    test_must_fail $BMLAUNCH --plan -g 1 -n 1 --model d48 --fp8 2 2>err &&
    grep -q "^bmlaunch: --fp8 must be 0 or 1, got .2." err &&
    test_must_fail $BMLAUNCH --plan -g 1 -n 1 --model d48 --fp8-speedup 1.5 2>err &&
    grep -q "^bmlaunch: --fp8-speedup is how much faster the products run in FP8: it needs --fp8 1" err &&
    test_must_fail $BMLAUNCH --plan -g 1 -n 1 --model d48 --fp8 0 --fp8-speedup 1.5 2>err &&
    grep -q "it needs --fp8 1" err &&
    test_must_fail $BMLAUNCH --plan -g 1 -n 1 --model d48 --fp8 1 --fp8-speedup 5 2>err &&
    grep -q "^bmlaunch: --fp8-speedup needs a speed-up factor in \[0.1, 4\] such as 1.3, got .5." err &&
    test_must_fail $BMLAUNCH --plan -g 1 -n 1 --fp8 1 2>err &&
    grep -q "go with --model" err
'

# GPT-2 learns its positions: a --seq-len beyond the preset's 1024 is a longer
# table (the trainer's --max-seq), (T - 1024) x C more parameters, gathered
# and reduced with the embedding; beyond the trainer's 65536 it is refused.
test_expect_success "GPT-2 presets: --seq-len above 1024 positions counts the longer table, above 65536 is refused" '
    j() { $BMLAUNCH --plan --json -g 1 -n 2 --gpus-per-node 2 --model d12 "$@"; } &&
    j >t1024.json && j --seq-len 512 >t512.json && j --seq-len 4096 >t4096.json &&
    /usr/bin/python3 - <<-PY &&
	import json
	def m(f):
	    return json.load(open(f))["cost_model"]["model"]["params"]
	assert m("t1024.json") == 124439808 and m("t512.json") == 124439808, m("t1024.json")
	assert m("t4096.json") - m("t1024.json") == (4096 - 1024) * 768
	PY
    $BMLAUNCH --plan -g 1 -n 1 --model d12 --seq-len 4096 >out &&
    grep -q "^  cost model: d12 = 126,799,104 parameters: .*, 4096 positions (the trainer.s --max-seq 4096)$" out &&
    $BMLAUNCH --plan -g 1 -n 1 --model d12 >out && ! grep -q "positions" out &&
    $BMLAUNCH --plan -g 1 -n 1 --model llama3.2-1b --seq-len 131072 >out && ! grep -q "positions" out &&
    test_must_fail $BMLAUNCH --plan -g 1 -n 1 --model d48 --seq-len 65537 2>err &&
    grep -q "^bmlaunch: --seq-len 65537: d48 learns its positions, and the trainer.s --max-seq makes at most 65536 of them" err
'

# Out-of-range link, MFU and memory inputs are refused with a message (an
# infinite or nan figure once printed inf, and --json failed without a word).
test_expect_success "the cost model's inputs are bounded: tiny bandwidths and MFU, a --gpu-mem of nothing usable" '
    for a in "--mfu 1e-320" "--mfu 0.009" "--nvlink-busbw 1e-320" "--nic-busbw 0.0001" "--busbw-group 1e-320" \
             "--busbw-replica 1e-320" "--busbw-flat 1e-320" "--fp8 1 --fp8-speedup 1e-320" "--gpu-mem 2" "--gpu-mem 1"; do
        for json in "" --json; do
            { $BMLAUNCH --plan $json -g 2 -n 2 --gpus-per-node 2 --model d12 $a >out 2>err; rc=$?; } &&
            test $rc -eq 2 && test ! -s out && grep -q "^bmlaunch: --" err || { echo "$a $json: rc $rc"; cat err; exit 1; }
        done
    done &&
    $BMLAUNCH --plan --json -g 2 -n 2 --gpus-per-node 2 --model d12 --mfu 0.01 --nvlink-busbw 0.001 \
        --nic-busbw 0.001 --gpu-mem 2.5 --fp8 1 --fp8-speedup 0.1 >lo.json &&
    /usr/bin/python3 -c "import json, sys; json.load(open(sys.argv[1]))" lo.json
'

test_expect_success "the issue's question: 20x50 on 8-GPU nodes is not recommended, and why" '
    $BMLAUNCH --plan --model 70B -g 20 -n 50 --gpus-per-node 8 >out &&
    grep -qE "^  \* +[0-9]+  20 x 50 +1000 " out &&
    grep -qE "^     [0-9 ]+ 20 x 48 +960 .*rail-aligned alternative$" out &&
    grep -qE "^     [0-9 ]+ 1 x 1000 +1000 .*flat$" out &&
    grep -q "^  recommendation: --groups [0-9]* --gpus-per-group [0-9]*, .* a step faster than yours; what decides:" out &&
    grep -q "^      against group of 50 on 7 nodes, 2 on its thinnest, ring/Simple at 92.0 GB/s" out
'

test_expect_success "the worked example in docs/slurm.md is what bmlaunch prints" '
    quoted_after "$SRC/docs/slurm.md" "bmlaunch --plan --model 70B -g 20 -n 50 --gpus-per-node 8" >quoted &&
    test -s quoted &&
    $BMLAUNCH --plan --model 70B -g 20 -n 50 --gpus-per-node 8 | sed -n "/^  cost model:/,\$p" >actual &&
    diff -u quoted actual
'

test_expect_success "docs/planner.md: the worked example and the predicted-vs-measured table are current" '
    quoted_after "$SRC/docs/planner.md" "bmlaunch --plan --model d48 --micro-batch 8 -g 1 -n 2 --gpus-per-node 2" >quoted &&
    test -s quoted &&
    $BMLAUNCH --plan --model d48 --micro-batch 8 -g 1 -n 2 --gpus-per-node 2 | sed -n "/^  cost model:/,\$p" >actual &&
    diff -u quoted actual &&
    "$SRC/bench/planner_check.sh" "$BMLAUNCH" >table &&
    grep -c "^| d" table >rows && test "$(cat rows)" = 12 &&
    while read -r line; do grep -qxF -- "$line" "$SRC/docs/planner.md" || { echo "missing: $line"; exit 1; }; done <table
'

test_expect_success "--plan --model handles 100k ranks in seconds" '
    with_timeout 60 $BMLAUNCH --plan --model llama3-405b -g 2000 -n 50 --gpus-per-node 8 >out &&
    grep -q "^  recommendation: " out
'

test_done
