#!/bin/bash
# Checkpoints (bmt/ckpt.h) through the GPT-2 trainer on CPU ranks:
# - saved under 2x2, resumed under 2x2 (bitwise the same losses and files as an
#   uninterrupted run), 1x4, 4x1 and 1x1 with 4 micro-batches (same losses
#   within f32 reduction-order noise);
# - the files are valid safetensors read by an independent reader (numpy), the
#   index is HF's, and PyTorch computing the loss from the saved weights gets
#   the resumed run's next loss;
# - keep K, leftovers of a crashed save, corrupt or mismatched checkpoints
#   refused with the file and tensor named, SIGUSR1 saves and stops, a second
#   job into a running job's --save-dir refused;
# - models the trainer cannot build (test_safetensors --ckpt): blocks that
#   would share a file, a parameter of another dtype than the file's, a
#   1090-character parameter name, a 2999-byte directory, a save while an
#   async one is pending, a negative step in train_state.json.
. "$(dirname "$0")/lib.sh"

PY=/usr/bin/python3
GPT2=$BUILDDIR/bin/gpt2
export BMT_TIMEOUT=60
DATA=$TMP/corpus_train.bin
"$GPT2" --prepare "$SRC/examples/gpt2/data/corpus.txt" --out "$TMP/corpus" >/dev/null ||
    echo "# could not tokenize the corpus"

# run NAME LAYOUT-ARGS -- gpt2 ARGS: jsonl metrics in NAME-<rank>.jsonl, output in NAME.out
run() {
    local name=$1 rc=0
    shift
    BMT_PLUGINS=jsonl BMT_JSONL=$PWD/$name-%r.jsonl with_timeout 200 "$BMLAUNCH" --metrics-port 0 \
        "$@" >$name.out 2>$name.err || rc=$?
    [ $rc -eq 0 ] || { echo "$name: exit $rc"; tail -5 $name.err; }
    return $rc
}
# losses NAME: "step loss" per line from rank 0's jsonl, full precision
losses() {
    $PY -c "
import json, sys
for l in open(sys.argv[1]):
    j = json.loads(l)
    if j.get(\"type\") == \"step\":
        print(j[\"step\"], repr(j[\"loss\"]))" $1-0.jsonl
}
export -f run losses

# The uninterrupted reference: 10 steps under 2x2, checkpoints at 5 and 10.
(cd $TMP && run ref -g 2 -n 2 -- $GPT2 --data $DATA --steps 10 --save-dir A --save-every 5 --keep 0 &&
    losses ref >ref.losses) || echo "# the reference run failed"

test_expect_success "a 2x2 run saves step 5 and 10; latest names step 10; files are complete" '
    test "$(cat $TMP/A/latest)" = step-00000010 &&
    for s in 5 10; do
        d=$TMP/A/step-0000000$s; [ $s = 10 ] && d=$TMP/A/step-00000010
        test -f $d/train_state.json && test -f $d/model.safetensors.index.json &&
        test $(ls $d/*.optim.safetensors | wc -l) -eq 5 &&
        test $(ls $d/*.safetensors | grep -vc optim) -eq 5 || exit 1
    done &&
    ! ls -a $TMP/A | grep -q "^\.tmp" &&
    grep -q "^0: gpt2: saved A/step-00000005$" $TMP/ref.out
'

test_expect_success "resumed under 2x2 from step 5: losses 6..10 and the step-10 files are bitwise the uninterrupted run" '
    cp -r $TMP/A R && echo step-00000005 >R/latest && rm -rf R/step-00000010 &&
    run res -g 2 -n 2 -- $GPT2 --data $DATA --steps 10 --save-dir R --resume &&
    grep -q "^0: gpt2: resumed from R/step-00000005 (step 5)" res.out &&
    losses res >res.losses && test $(wc -l <res.losses) -eq 5 &&
    diff res.losses <(tail -5 $TMP/ref.losses) &&
    for f in $TMP/A/step-00000010/*.safetensors; do cmp $f R/step-00000010/$(basename $f) || exit 1; done
'

for v in "1x4:-g 1 -n 4" "4x1:-g 4 -n 1" "1x1 with 4 micro-batches:-n 1 -- --accum 4"; do
    what=${v%%:*} args=${v#*:}
    lay=${args%% -- *} extra=
    [ "$lay" != "$args" ] && extra=${args#* -- }
    test_expect_success "resumed under $what from the 2x2 checkpoint: the same losses (1e-5)" "
        cp -r \$TMP/A R && echo step-00000005 >R/latest && rm -rf R/step-00000010 &&
        run res $lay -- \$GPT2 --data \$DATA --steps 10 --save-dir R --resume $extra &&
        losses res >res.losses &&
        \$PY -c '
import sys
ref = dict(l.split() for l in open(sys.argv[1]))
got = dict(l.split() for l in open(sys.argv[2]))
assert sorted(got, key=int) == [\"6\", \"7\", \"8\", \"9\", \"10\"], got
worst = max(abs(float(got[s]) - float(ref[s])) / float(ref[s]) for s in got)
print(\"worst relative difference\", worst)
assert worst <= 1e-5, worst' \$TMP/ref.losses res.losses
    "
done

# Small shards (1000, 1100, 900, 1300 tokens): a global batch of 8 x 64 moves
# to the next shard every step or two, so a step whose micro-batches straddled
# two shards (the shard end decided per micro-batch, as llm.c does) reads other
# tokens than the same batch in one micro-batch.
$PY - $DATA $TMP/sh <<-'EOF' || echo "# could not write the small shards"
	import os, sys, numpy as np
	t = np.fromfile(sys.argv[1], dtype=np.uint16)[512:]
	os.makedirs(sys.argv[2], exist_ok=True)
	for i, n in enumerate([1000, 1100, 900, 1300]):
	    h = np.zeros(256, np.int32); h[:3] = (20240520, 1, n)
	    with open("%s/s%d.bin" % (sys.argv[2], i), "wb") as f:
	        f.write(h.tobytes()); f.write(t[i * 2000:i * 2000 + n].tobytes())
	EOF
# same_losses REF GOT: every step of GOT is REF's within 1e-5 (relative)
same_losses() {
    $PY -c '
import sys
ref = dict(l.split() for l in open(sys.argv[1]))
got = dict(l.split() for l in open(sys.argv[2]))
assert got and set(got) <= set(ref), (sorted(got), sorted(ref))
worst = max(abs(float(got[s]) - float(ref[s])) / float(ref[s]) for s in got)
print(sys.argv[2], "worst relative difference", worst)
assert worst <= 1e-5, worst' "$1" "$2"
}
export -f same_losses

test_expect_success "one global batch in micro-batches reads the same tokens at shard ends: 1x1 -b 8 = 2x2 -b 2 = 1x1 -b 2 -a 4 = 2x1 -b 2 -a 2 (1e-5), resumed under -a 4 too" '
    S="$TMP/sh/s*.bin" &&
    run m8 -n 1 -- $GPT2 --data "$S" --steps 8 --save-dir M --save-every 3 --keep 0 -b 8 &&
    losses m8 >m8.losses && test $(wc -l <m8.losses) -eq 8 &&
    run m22 -g 2 -n 2 -- $GPT2 --data "$S" --steps 8 -b 2 && losses m22 >m22.losses &&
    run ma4 -n 1 -- $GPT2 --data "$S" --steps 8 -b 2 -a 4 && losses ma4 >ma4.losses &&
    run m21 -g 2 -- $GPT2 --data "$S" --steps 8 -b 2 -a 2 && losses m21 >m21.losses &&
    same_losses m8.losses m22.losses && same_losses m8.losses ma4.losses &&
    same_losses m8.losses m21.losses &&
    echo step-00000003 >M/latest && rm -rf M/step-00000006 M/step-00000008 &&
    run mr -n 1 -- $GPT2 --data "$S" --steps 8 -b 2 --save-dir M --resume &&
    grep -q "^0: gpt2: --accum 4 keeps the checkpoint" mr.out &&
    losses mr >mr.losses && test $(wc -l <mr.losses) -eq 5 && same_losses m8.losses mr.losses
'

test_expect_success "a shard shorter than a step of micro-batches is refused before step 1, naming it (-b 2 -a 8: 1025 tokens a step, on shards of 900 to 1300)" '
    rc=0; run short -n 1 -- $GPT2 --data "$TMP/sh/s*.bin" --steps 2 -b 2 -a 8 || rc=$? &&
    test $rc -ne 0 && ! grep -q "step  *1/" short.out &&
    grep -q "sh/s0.bin: 1000 tokens, fewer than one global batch needs: accum\*world\*B\*T+1 = 8\*1\*2\*64+1 = 1025" short.err
'

test_expect_success "an independent reader: valid safetensors, HF index, and PyTorch gets the resumed loss from the saved weights" '
    cp -r $TMP/A R && echo step-00000005 >R/latest && rm -rf R/step-00000010 &&
    run res -g 2 -n 2 -- $GPT2 --data $DATA --steps 6 --save-dir R --resume &&
    $PY - $TMP/A/step-00000005 $DATA "$(sed -n "s/^6 //p" $TMP/ref.losses)" <<-EOF
	import json, os, struct, sys, numpy as np, torch
	sys.path.insert(0, "$SRC/tests/tools")
	import gpt2_oracle as o
	d, data, want = sys.argv[1], sys.argv[2], float(sys.argv[3])
	def read(path):  # the format, by hand: 8-byte length, JSON, data; offsets contiguous
	    raw = open(path, "rb").read()
	    n = struct.unpack("<Q", raw[:8])[0]
	    h = json.loads(raw[8:8 + n]); meta = h.pop("__metadata__", {})
	    assert meta.get("format") == "pt", meta
	    spans = sorted(v["data_offsets"] for v in h.values())
	    assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
	    assert 8 + n + spans[-1][1] == len(raw), (path, len(raw))
	    out = {}
	    for k, v in h.items():
	        assert v["dtype"] == "F32", v
	        b, e = v["data_offsets"]
	        a = np.frombuffer(raw[8 + n + b:8 + n + e], dtype=np.float32)
	        assert a.size == int(np.prod(v["shape"])), (k, v)
	        out[k] = a.reshape(v["shape"])
	    return out
	idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
	w, total = {}, 0
	for f in sorted(set(idx["weight_map"].values())):
	    t = read(os.path.join(d, f))
	    assert set(t) == {k for k, v in idx["weight_map"].items() if v == f}, f
	    w.update(t); total += sum(a.nbytes for a in t.values())
	assert idx["metadata"]["total_size"] == total, (idx["metadata"], total)
	for f in os.listdir(d):
	    if f.endswith(".optim.safetensors"):
	        m = read(os.path.join(d, f))
	        assert all(k.endswith((".exp_avg", ".exp_avg_sq")) for k in m), list(m)[:3]
	        assert all((m[k] >= 0).all() for k in m if k.endswith("exp_avg_sq"))
	st = json.load(open(os.path.join(d, "train_state.json")))
	assert st["step"] == 5 and st["user"]["step"] == 5 and st["layout"]["world"] == 4, st
	# PyTorch: the loss of global batch 6 (index 5) from the saved weights
	o.V, o.C, o.NH, o.L, o.MAXT = 256, 64, 4, 4, 256
	p = {k[len("transformer."):]: torch.tensor(v, dtype=torch.float64) for k, v in w.items()}
	tokens = np.fromfile(data, dtype=np.uint16)[512:]
	loss = o.world_loss(p, o.batches(tokens, 4, 4, 64, 5)).item()
	print("torch %.7f, the resumed run %.7f" % (loss, want))
	assert abs(loss - want) <= 1e-5 * want
	EOF
'

test_expect_success "--save-async writes the same files as a synchronous save, completed before the end" '
    run async -g 2 -n 2 -- $GPT2 --data $DATA --steps 10 --save-dir AS --save-every 5 --keep 0 --save-async &&
    grep -q "^0: gpt2: saving AS/step-00000005$" async.out &&
    grep -q "^0: gpt2: the last checkpoint is complete$" async.out &&
    test "$(cat AS/latest)" = step-00000010 &&
    for s in step-00000005 step-00000010; do
        for f in $TMP/A/$s/*.safetensors $TMP/A/$s/model.safetensors.index.json; do
            cmp $f AS/$s/$(basename $f) || exit 1
        done
    done &&
    diff <(losses async) $TMP/ref.losses
'

test_expect_success "every committed save, sync or async, is one checkpoint_saved event from rank 0 (jsonl plugin)" '
    run evs -g 2 -n 1 -- $GPT2 --data $DATA --steps 4 --save-dir EV --save-every 2 --keep 0 &&
    run eva -g 2 -n 1 -- $GPT2 --data $DATA --steps 4 --save-dir EA --save-every 2 --keep 0 --save-async &&
    for f in evs:EV eva:EA; do
        $PY - ${f%%:*}-0.jsonl ${f%%:*}-1.jsonl ${f##*:} <<-PY || exit 1
	import json, sys
	ev = [json.loads(l) for l in open(sys.argv[1])]
	saved = [e["detail"] for e in ev if e.get("type") == "event" and e["kind"] == "checkpoint_saved"]
	assert [s.rsplit("/", 2)[-2:] for s in saved] == [[sys.argv[3], "step-00000002"], [sys.argv[3], "step-00000004"]], saved
	other = [l for l in open(sys.argv[2]) if "checkpoint_saved" in l]
	assert not other, other
	PY
    done
'

test_expect_success "--keep 2 keeps the newest two; a leftover .tmp- of a crashed save is removed by the next save" '
    mkdir -p K/.tmp-step-00000004 && echo junk >K/.tmp-step-00000004/junk &&
    run keep -n 2 -- $GPT2 --data $DATA --steps 8 --save-dir K --save-every 2 --keep 2 &&
    test "$(ls K | tr "\n" " ")" = "latest step-00000006 step-00000008 " &&
    test "$(cat K/latest)" = step-00000008 && ! test -e K/.tmp-step-00000004
'

test_expect_success "a checkpoint that does not fit, or is damaged, is refused with the file and tensor named (a --resume names what it loads)" '
    cp -r $TMP/A/step-00000005 good &&
    mkdir -p S1 && cp -r good S1/x && echo x >S1/latest &&
    { run bad -n 1 -- $GPT2 --data $DATA --steps 6 --embd 32 --save-dir S1 --resume; rc=$?; } &&
    test $rc -ne 0 && grep -q "transformer.safetensors.*transformer.wte.weight" bad.err &&
    mkdir -p S2 && cp -r good S2/x && echo x >S2/latest &&
    truncate -s -100 S2/x/transformer.h.2.safetensors &&
    { run bad -n 1 -- $GPT2 --data $DATA --steps 6 --save-dir S2 --resume; rc=$?; } &&
    test $rc -ne 0 && grep -q "transformer.h.2.safetensors" bad.err &&
    mkdir -p S3 && cp -r good S3/x && echo x >S3/latest && rm S3/x/transformer.h.1.optim.safetensors &&
    { run bad -n 1 -- $GPT2 --data $DATA --steps 6 --save-dir S3 --resume; rc=$?; } &&
    test $rc -ne 0 && grep -q "transformer.h.1.optim.safetensors" bad.err &&
    mkdir -p S4 && echo step-00000099 >S4/latest &&
    { run bad -n 1 -- $GPT2 --data $DATA --steps 6 --save-dir S4 --resume; rc=$?; } &&
    test $rc -ne 0 &&
    grep -qx "0: gpt2: rank 0: loading S4: S4/latest names S4/step-00000099, which has no train_state.json" bad.err
'

test_expect_success "--resume with no checkpoint yet starts at step 1" '
    run fresh -n 1 -- $GPT2 --data $DATA --steps 2 --save-dir N --resume &&
    ! grep -q resumed fresh.out && grep -q "^0: step   1/2" fresh.out && test -f N/step-00000002/train_state.json
'

test_expect_success "a rank killed mid-run: bmlaunch --max-restarts 1 restarts the job and the trainer resumes from latest" '
    port=$($PY -c "import socket; s=socket.socket(); s.bind((\"127.0.0.1\", 0)); print(s.getsockname()[1])") &&
    { BMT_PLUGINS=jsonl BMT_JSONL=$PWD/rs-%r.jsonl with_timeout 200 $BMLAUNCH --metrics-port $port \
        --metrics-linger 60 --max-restarts 1 -g 2 -n 2 -- $GPT2 --data $DATA --steps 10 --save-dir RS \
        --save-every 4 --keep 0 --resume >rs.out 2>rs.err & }
    pid=$!
    for i in $(seq 600); do grep -q "step   6/10" rs.out && break; sleep 0.1; done
    victim=$(pgrep -f "^$GPT2 --data $DATA --steps 10 --save-dir RS" | head -1)
    test -n "$victim" && kill -9 $victim
    for i in $(seq 1200); do
        curl -sf "http://127.0.0.1:$port/api/status" >s.json && grep -q "\"state\":\"ended\"" s.json && break
        sleep 0.1
    done
    kill -INT $pid
    rc=0; wait $pid || rc=$?
    test $rc -eq 0 &&
    $PY -c "
import json
s = json.load(open(\"s.json\"))
steps = [p[\"step\"] for p in s[\"history\"]]
assert steps == list(range(1, 11)), steps   # the resumed run replaced the repeated steps
restart = [e[\"time\"] for e in s[\"events\"] if e[\"kind\"] == \"restart\" and e[\"rank\"] == -1]
assert len(restart) == 1, s[\"events\"]
# steps 5 and 6 ran before the kill and again after the resume from step 4: the
# history holds the figures of the second run
late = [p[\"time\"] for p in s[\"history\"] if p[\"step\"] in (5, 6)]
assert all(t > restart[0] for t in late), (late, restart)
assert s[\"exit_status\"] == 0 and s[\"step\"] == 10
" &&
    grep -q "^bmlaunch: restart 1 of 1 after rank [0-3] .* killed by signal 9" rs.err &&
    from=$(sed -n "s|^0: gpt2: resumed from RS/step-0*\([0-9]*\) (step .*|\1|p" rs.out) &&
    test "$from" = 4 &&
    test "$(cat RS/latest)" = step-00000010 &&
    # the resumed steps are bitwise the uninterrupted run (same layout, same data)
    $PY -c "
import json, sys
ref = dict(l.split() for l in open(sys.argv[1]))
got = {}
for l in open(\"rs-0.jsonl\"):
    j = json.loads(l)
    if j.get(\"type\") == \"step\":
        got[str(j[\"step\"])] = repr(j[\"loss\"])   # the last run wins
assert got[\"10\"] == ref[\"10\"] and got[str($from + 1)] == ref[str($from + 1)], (got, ref)
" $TMP/ref.losses
'

test_expect_success "BMT_FAULT=step:3:7 with --max-restarts 1: the job completes and its final checkpoint is the uninterrupted one" '
    BMT_FAULT=step:3:7 run fault -g 2 -n 2 --max-restarts 1 -- $GPT2 --data $DATA --steps 10 \
        --save-dir F --save-every 2 --keep 0 --resume &&
    grep -q "bmt: rank 3: BMT_FAULT: killing myself after step 7" fault.err &&
    grep -q "^bmlaunch: restart 1 of 1 after rank 3 .*killed by signal 9" fault.err &&
    grep -q "^0: gpt2: resumed from F/step-00000006 (step 6)" fault.out &&
    for f in $TMP/A/step-00000010/*.safetensors; do cmp $f F/step-00000010/$(basename $f) || exit 1; done
'

# Slurm's SIGUSR1 before the time limit reached a run that then failed: the
# restarted run must hear it too, or it trains on until the limit kills it
# without a checkpoint. Run 0 (a shell) sends bmlaunch SIGUSR1 and fails;
# run 1's trainers get it at bmt_init (BMT_PENDING_SIGNALS), save at step 1
# and exit 0. bmlaunch used to drop it: run 1 trained all 30 steps.
test_expect_success "SIGUSR1 to a run that then fails: the restarted run gets it at bmt_init, saves at its first step, exit 0" '
    run pend -n 1 --max-restarts 1 -- sh -c "if [ \$BMT_RESTART = 0 ]; then
        trap \"echo usr1\" USR1; kill -USR1 \$PPID; sleep 1; exit 1; fi
        exec $GPT2 --data $DATA --steps 30 --save-dir P --resume" &&
    grep -q "^bmlaunch: restart 1: SIGUSR1 came before this run; its ranks get it at bmt_init (BMT_PENDING_SIGNALS)" pend.err &&
    grep -q "^0: usr1" pend.out && grep -q "^0: step   1/30 " pend.out && ! grep -q "^0: step   2/30" pend.out &&
    grep -q "^0: gpt2: saved P/step-00000001 (SIGUSR1: stopping)" pend.out &&
    test "$(cat P/latest)" = step-00000001 &&
    BMT_PENDING_SIGNALS=USR1 run clean -n 1 -- sh -c "env | grep ^BMT_PENDING || echo none" &&
    grep -qx "0: none" clean.out &&
    { BMT_PENDING_SIGNALS=USR3 $PROGS/hello 2>bad.err; rc=$?; } && test $rc -ne 0 &&
    grep -q "BMT_PENDING_SIGNALS=.USR3. is not USR1, USR2 or USR1,USR2 (bmlaunch sets it)" bad.err
'

test_expect_success "kill -9 of a rank in the middle of a save: latest still names the previous checkpoint, a new run resumes from it" '
    { BMT_FAULT=save:1:6 run crash -g 2 -n 2 -- $GPT2 --data $DATA --steps 10 --save-dir C \
        --save-every 2 --keep 0; rc=$?; } &&
    test $rc -eq 137 && grep -q "bmt: rank 1: BMT_FAULT: killing myself while saving step 6" crash.err &&
    test "$(cat C/latest)" = step-00000004 && ! test -e C/step-00000006 &&
    test -f C/step-00000004/train_state.json &&
    run again -g 2 -n 2 -- $GPT2 --data $DATA --steps 10 --save-dir C --save-every 2 --keep 0 --resume &&
    grep -q "^0: gpt2: resumed from C/step-00000004 (step 4)" again.out &&
    ! ls -a C | grep -q "^\.tmp" &&
    for f in $TMP/A/step-00000010/*.safetensors; do cmp $f C/step-00000010/$(basename $f) || exit 1; done
'

# Two jobs in one --save-dir (a job started twice, a requeued one whose first
# copy still runs) removed each other's .tmp- directories and replaced each
# other's step directories: both said "saved", exit 0, and a step directory
# could be left with its JSON files only. The running job locks DIR.
test_expect_success "a second job into the --save-dir of a running job is refused before its first step (with --resume too); the running job saves as before" '
    { BMT_TIMEOUT=60 $BMLAUNCH --metrics-port 0 -n 1 -- $GPT2 --data $DATA --steps 100000 \
        --save-dir W >w1.out 2>w1.err & }
    pid=$!
    for i in $(seq 300); do grep -q "step *2/" w1.out && break; sleep 0.1; done
    rc2=0; run w2 -n 2 -- $GPT2 --data $DATA --steps 3 --save-dir W --resume || rc2=$?
    kill -USR1 $pid
    rc=0; wait $pid || rc=$?
    test $rc -eq 0 && test $rc2 -ne 0 &&
    grep "^bmlaunch: job failed:" w2.err | grep -q ": --save-dir W is in use: another job running now saves its checkpoints there (it holds W/.lock); two jobs in one directory remove and replace each other.s checkpoints: wait for that job to end, or save into another directory" &&
    ! grep -q "step   1/3" w2.out && ! grep -q "saved" w2.out &&
    step=$(sed -n "s|^0: gpt2: saved W/step-0*\([0-9]*\) (SIGUSR1: stopping)$|\1|p" w1.out) && test -n "$step" &&
    test "$(cat W/latest)" = "$(printf step-%08d $step)" && test "$(ls W)" = "$(printf "latest\nstep-%08d" $step)" &&
    $GPT2 --verify W >/dev/null &&
    run w3 -n 1 -- $GPT2 --data $DATA --steps $((step + 1)) --save-dir W --resume &&
    grep -q "^0: gpt2: resumed from W/step-0*$step (step $step)" w3.out ||
        { echo "the first job: exit $rc; the second: exit $rc2"; tail -2 w2.out; ls W; exit 1; }
'

test_expect_success "a run that fails before its first save leaves no --save-dir it made; one that was there stays" '
    { run nd -n 1 -- $GPT2 --data missing.bin --steps 2 --save-dir ND; rc=$?; } && test $rc -ne 0 && ! test -e ND &&
    mkdir ED && { run ed -n 1 -- $GPT2 --data missing.bin --steps 2 --save-dir ED; rc=$?; } && test $rc -ne 0 &&
    test "$(ls -a ED | tr "\n" " ")" = ". .. .lock "
'

test_expect_success "a malformed BMT_FAULT fails bmt_init with what to write" '
    { BMT_FAULT=boom run badf -n 1 -- $GPT2 --data $DATA --steps 1; rc=$?; } &&
    test $rc -ne 0 && grep -q "BMT_FAULT=.boom.: use step:RANK:STEP, save:RANK:STEP or nan:RANK:STEP" badf.err
'

test_expect_success "SIGUSR1 to bmlaunch: the ranks save at the next step boundary and exit 0; a resume continues" '
    { BMT_TIMEOUT=60 $BMLAUNCH --metrics-port 0 -g 2 -n 2 -- $GPT2 --data $DATA --steps 100000 \
        --save-dir U >usr.out 2>usr.err & }
    pid=$!
    for i in $(seq 300); do grep -q "step *3/" usr.out && break; sleep 0.1; done
    kill -USR1 $pid
    rc=0; wait $pid || rc=$?
    test $rc -eq 0 &&
    step=$(sed -n "s|^0: gpt2: saved U/step-0*\([0-9]*\) (SIGUSR1: stopping)$|\1|p" usr.out) &&
    test -n "$step" && test "$step" -ge 3 && test "$(cat U/latest)" = "$(printf step-%08d $step)" &&
    run usr2 -g 2 -n 2 -- $GPT2 --data $DATA --steps $((step + 1)) --save-dir U --resume &&
    grep -q "resumed from U/step-.* (step $step)" usr2.out && grep -q "step *$((step + 1))/" usr2.out
'

# ck ARGS...: test_safetensors --ckpt ARGS (a model of 4-element parameters
# under bmt_init, one process): output in ck.out, its status
CK=$BUILDDIR/tests/unit/test_safetensors
ck() {
    local rc=0
    with_timeout 60 "$CK" --ckpt "$@" >ck.out 2>&1 || rc=$?
    return $rc
}
export CK
export -f ck

# Refused as the model is built (bmt_blocklist_append; x and x.optim at
# bmt_adamw_create, where the optimizer's files come in), not at the first
# save after hours of training: exit 1, "building the model".
test_expect_success "blocks that would share a file or a tensor name: refused as the model is built, before any save or load makes or reads anything" '
    { ck save D x x; rc=$?; } && test $rc -eq 1 && ! test -e D &&
    grep -qx "ckpt: building the model: rank 0: bmt_blocklist_append: two blocks are named .x.: a checkpoint needs a file of its own per block (give the blocks distinct names)" ck.out &&
    { ck save D x x.optim; rc=$?; } && test $rc -eq 1 && ! test -e D &&
    grep -qx "ckpt: building the model: rank 0: bmt_adamw_create: blocks .x. and .x.optim. would share the file x.optim.safetensors: a checkpoint needs a file of its own per block (give the blocks distinct names)" ck.out &&
    { ck save D a/b a_b; rc=$?; } && test $rc -eq 1 && ! test -e D &&
    grep -q "bmt_blocklist_append: blocks .a/b. and .a_b. would share the file a_b" ck.out &&
    { ck save D a:b.w a.b:w; rc=$?; } && test $rc -eq 1 && ! test -e D &&
    grep -q "bmt_blocklist_append: two blocks have a parameter named .a.b.w." ck.out &&
    ck save D --no-optim x x.optim && ck load D --no-optim x.optim x &&
    ck save G x y && cp ck.out saved && ck load G y x && diff <(sort saved) <(sort ck.out) &&
    { ck load G x x; rc=$?; } && test $rc -eq 1 &&
    grep -q "ckpt: building the model: rank 0: bmt_blocklist_append: two blocks are named .x." ck.out
'

test_expect_success "a block named model (its file model.safetensors, which from_pretrained and bmt_st_open read instead of the index) is refused as the model is built; model.x is fine" '
    { ck save D model y; rc=$?; } && test $rc -eq 1 && ! test -e D &&
    grep -qx "ckpt: building the model: rank 0: bmt_blocklist_append: block .model. would be saved as model.safetensors, which transformers. from_pretrained and bmt_st_open read instead of the checkpoint.s index (the other blocks unread): give the block another name" ck.out &&
    ck save D model.x y && test -f D/ck/model.x.safetensors && ! test -e D/ck/model.safetensors &&
    ck load D y model.x
'

test_expect_success "blocks of one name under 2 ranks: every rank refuses as the model is built, nothing is made, no hang" '
    { with_timeout 60 $BMLAUNCH --metrics-port 0 -n 2 -- $CK --ckpt save D x x >out 2>err; rc=$?; } &&
    test $rc -ne 0 && test $rc -ne 124 && cat out err | grep -q "two blocks are named .x." && ! test -e D
'

test_expect_success "a checkpoint loads only into parameters of its dtype: f32 into bf16 is refused naming file, tensor and both dtypes" '
    ck save D --no-optim x y && cp ck.out saved &&
    { ck load D --no-optim --bf16 x y; rc=$?; } && test $rc -eq 3 &&
    grep -qx "ckpt: refused: rank 0: loading D/ck: D/ck/x.safetensors: tensor .x.w. is F32, the model.s is BF16" ck.out &&
    ck save B --no-optim --bf16 x y && { ck load B --no-optim x y; rc=$?; } && test $rc -eq 3 &&
    grep -q "tensor .x.w. is BF16, the model.s is F32" ck.out &&
    ck load D --no-optim x y && cmp saved ck.out
'

test_expect_success "a parameter named by 1090 characters: saved, loaded (the name was cut at 1100 bytes) and verified" '
    q=$(printf "q%.0s" $(seq 1090)) &&
    ck save D "b:$q" && cp ck.out saved && ck load D "b:$q" && cmp saved ck.out &&
    $BUILDDIR/bin/gpt2 --verify D >v.out && grep -q ": ok: step 0, 1 blocks, 2 files, 3 tensors" v.out
'

test_expect_success "a directory of 2999 bytes: the shards go into the checkpoint (a cut path put them beside it), which loads" '
    d=L; while [ ${#d} -lt 2999 ]; do d=$d/$(printf "d%.0s" $(seq 200)); done; d=${d:0:2999} &&
    mkdir -p $d && ck save $d --name s1 x y && cp ck.out saved &&
    test "$(ls $d | tr "\n" " ")" = "latest s1 " &&
    test -f $d/s1/x.safetensors && test -f $d/s1/y.optim.safetensors &&
    ck load $d x y && cmp saved ck.out
'

test_expect_success "a save while an async save is pending is refused (it took the pending one's directory); the pending one completes" '
    { ck async2 D x y; rc=$?; } && test $rc -eq 3 &&
    grep -qx "ckpt: refused: rank 0: checkpoint D/ck: the save into D/.tmp-ck is still pending: call bmt_ckpt_finish before the next save" ck.out &&
    test "$(cat D/latest)" = ck && $BUILDDIR/bin/gpt2 --verify D >v.out && ! ls -a D | grep -q "^\.tmp"
'

test_expect_success "a negative step in train_state.json is refused by the load and by --verify (AdamW would have resumed at step -7)" '
    ck save D x y && sed -i "s/\"step\": 0,/\"step\": -7,/" D/ck/train_state.json &&
    grep -q "\"step\": -7," D/ck/train_state.json &&
    { ck load D x y; rc=$?; } && test $rc -eq 3 &&
    grep -qx "ckpt: refused: D/ck/train_state.json: step -7, skipped 0: a counter is negative (damaged)" ck.out &&
    test_must_fail $BUILDDIR/bin/gpt2 --verify D 2>v.err && grep -q "step -7, skipped 0: a counter is negative" v.err
'

test_expect_success "an optimizer state missing or not F32 (checksums made for it): --verify refuses it as the load does (it passed it)" '
    ck save B --bf16 x y && $BUILDDIR/bin/gpt2 --verify B >v.out &&
    for t in x.w.master x.w.exp_avg y.w.exp_avg_sq; do
        rm -rf V && cp -r B V && $PY $SRC/tests/tools/ckpt_tool.py drop V/ck ${t%%.w*}.optim.safetensors $t &&
        $PY $SRC/tests/tools/ckpt_tool.py sums V/ck >/dev/null &&
        { $BUILDDIR/bin/gpt2 --verify V 2>v.err; rc=$?; } && test $rc -eq 1 &&
        grep -q "${t%%.w*}.optim.safetensors: no tensor .$t.: the optimizer.s state of parameter .${t%%.w*}.w. is incomplete" v.err &&
        { ck load V --bf16 x y; rc=$?; } && test $rc -eq 3 && grep -q "has no tensor .$t." ck.out || exit 1
    done &&
    rm -rf V && cp -r B V && $PY $SRC/tests/tools/ckpt_tool.py f16 V/ck x.optim.safetensors x.w.exp_avg &&
    { $BUILDDIR/bin/gpt2 --verify V 2>v.err; rc=$?; } && test $rc -eq 1 &&
    grep -q "x.optim.safetensors: tensor .x.w.exp_avg. is F16: the optimizer.s state is saved as F32" v.err &&
    { ck load V --bf16 x y; rc=$?; } && test $rc -eq 3
'

test_expect_success "a FIFO named latest is refused at once by a load (a --resume) and --verify, never waited on" '
    ck save F x y && rm F/latest && mkfifo F/latest &&
    { ck load F x y; rc=$?; } && test $rc -eq 3 &&
    grep -qx "ckpt: refused: F/latest: not a regular file: a --save-dir.s latest names its newest step directory" ck.out &&
    { with_timeout 20 $BUILDDIR/bin/gpt2 --verify F 2>v.err; rc=$?; } && test $rc -eq 1 &&
    grep -q "F/latest: not a regular file" v.err
'

test_done
