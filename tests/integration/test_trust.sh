#!/bin/bash
# Trust: failures that used to be silent (the job exited 0 with wrong data) now
# stop the job with a message that names the cause (docs/checkpoints.md, "Trust";
# docs/engine.md, "What the engine refuses"). CPU ranks through bmlaunch:
# - async and synchronous saves are byte-identical at every save, train_state.json
#   included (the async one used to record the next save's step);
# - a NaN in the parameters: the save refuses it, --max-skipped stops the run,
#   a load refuses it in a parameter or in the optimizer's state, --keep keeps
#   the good checkpoint;
# - checksums: recomputed by an independent reader (python3-xxhash); a flipped
#   bit is refused on load (another layout than the save's) and by gpt2 --verify;
# - a resume keeps the global batch or refuses with the options that would;
# - stale .tmp- directories go at any save or resume; long errors are not cut;
# - a save on a full file system names "No space left on device" in bmlaunch's
#   summary every time (a real 200 KB tmpfs, in a mount namespace); so does a
#   save out of space at each later file (a tmpfs filled to the page), and a
#   read-only remount, a --save-dir whose parent moved and a file-size limit
#   fail naming the cause, leaving latest and its checkpoint whole (the tmpfs
#   tests are skipped, and said so, where mount is not allowed);
# - a crash while --keep removes a checkpoint leaves nothing the next save
#   does not remove;
# - ranks that run different numbers of micro-batches, or build their blocks
#   differently (seed + rank, names, shapes, init), are refused; so are a second
#   optimizer on a list, a NULL shape, and a checkpoint with an extra block or
#   tensor (tests/progs/trust_check.c);
# - the public API's edge cases (tests/progs/api_check.c).
. "$(dirname "$0")/lib.sh"

PY=/usr/bin/python3
GPT2=$BUILDDIR/bin/gpt2
TC=$PROGS/trust_check
TOOL=$SRC/tests/tools/ckpt_tool.py
export BMT_TIMEOUT=60
DATA=$TMP/corpus_train.bin
"$GPT2" --prepare "$SRC/examples/gpt2/data/corpus.txt" --out "$TMP/corpus" >/dev/null ||
    echo "# could not tokenize the corpus"

# run NAME LAYOUT-ARGS -- PROGRAM ARGS: output in NAME.out and NAME.err; its status
run() {
    local name=$1 rc=0
    shift
    with_timeout 200 "$BMLAUNCH" --metrics-port 0 "$@" >$name.out 2>$name.err || rc=$?
    return $rc
}
export -f run

# References: 1x2 and 2x2, saves at 2 and 4.
(cd $TMP && run ref -n 2 -- $GPT2 --data $DATA --steps 4 --save-every 2 --keep 0 --save-dir G &&
    run a -g 2 -n 2 -- $GPT2 --data $DATA --steps 4 --save-every 2 --keep 0 --save-dir R) ||
    echo "# a reference run failed"

test_expect_success "--save-async and synchronous saves of one run are byte-identical at every save, train_state.json and checksums included" '
    run as -g 2 -n 2 -- $GPT2 --data $DATA --steps 6 --save-every 2 --keep 0 --save-async --save-dir AS &&
    run sy -g 2 -n 2 -- $GPT2 --data $DATA --steps 6 --save-every 2 --keep 0 --save-dir SY &&
    for s in 2 4 6; do
        d=step-0000000$s
        diff -r AS/$d SY/$d || exit 1
        $PY -c "import json, sys; t = json.load(open(sys.argv[1])); assert t[\"step\"] == $s and t[\"user\"][\"step\"] == $s, t[\"step\"]" AS/$d/train_state.json || exit 1
    done &&
    test $(ls AS/step-00000002/checksums-*.json | wc -l) -eq 2
'

test_expect_success "the checksums are XXH3-64 of every byte: an independent reader (python3-xxhash) recomputes them all" '
    for s in 2 4; do
        $PY $TOOL sums $TMP/G/step-0000000$s >sums.out && grep -q "^sums ok: 10 files, [0-9]* units" sums.out || exit 1
    done
'

test_expect_success "gpt2 --verify: a good checkpoint passes, with what it checked" '
    $GPT2 --verify $TMP/G >v.out &&
    grep -q "^gpt2: $TMP/G/step-00000004: ok: step 4, 5 blocks, 10 files, [0-9]* tensors, .* MiB checked (checksums of every byte, finite values, index, optimizer state" v.out
'

test_expect_success "a flipped bit: gpt2 --verify and a load under another layout (2x2 from 1x2) refuse it, naming file, tensor and bytes" '
    cp -r $TMP/G F && $PY $TOOL flip F/step-00000004 transformer.h.2.safetensors transformer.h.2.mlp.c_fc.weight 1000 &&
    { $GPT2 --verify F >v.out 2>v.err; rc=$?; } && test $rc -eq 1 &&
    grep -q "transformer.h.2.safetensors: tensor .transformer.h.2.mlp.c_fc.weight.: checksum mismatch in bytes \[[0-9]*, [0-9]*) of the file (recorded [0-9a-f]*, read [0-9a-f]*): the file is damaged" v.err &&
    { run bad -g 2 -n 2 -- $GPT2 --data $DATA --steps 6 -b 2 --save-dir F --resume; rc=$?; } && test $rc -ne 0 &&
    grep "^bmlaunch: job failed:" bad.err | grep -q "transformer.h.2.safetensors: tensor .transformer.h.2.mlp.c_fc.weight.: checksum mismatch" &&
    ! grep -q "step   5/6" bad.out
'

test_expect_success "a damaged header, a truncated file and a missing checksums file are refused too" '
    cp -r $TMP/G/step-00000004 H &&
    $PY $TOOL header H transformer.h.0.safetensors &&
    ! cmp -s H/transformer.h.0.safetensors $TMP/G/step-00000004/transformer.h.0.safetensors &&
    { $GPT2 --verify H 2>v.err; rc=$?; } && test $rc -eq 1 && grep -q "transformer.h.0.safetensors: checksum mismatch in its header" v.err &&
    cp -r $TMP/G/step-00000004 T && truncate -s -8 T/transformer.h.3.optim.safetensors &&
    { $GPT2 --verify T 2>v.err; rc=$?; } && test $rc -eq 1 && grep -q "transformer.h.3.optim.safetensors" v.err &&
    cp -r $TMP/G/step-00000004 M && rm M/checksums-00001.json &&
    { $GPT2 --verify M 2>v.err; rc=$?; } && test $rc -eq 1 && grep -q "checksums-00001.json: not a checksums file" v.err
'

test_expect_success "a NaN in a weight (checksums fixed): the load refuses it, naming file, tensor and element; --verify too" '
    cp -r $TMP/G N && $PY $TOOL plant N/step-00000004 transformer.h.1.safetensors transformer.h.1.attn.c_attn.weight 77 nan --fix-sums &&
    $PY $TOOL sums N/step-00000004 >/dev/null &&
    { $GPT2 --verify N 2>v.err; rc=$?; } && test $rc -eq 1 &&
    grep -q "transformer.h.1.safetensors: tensor .transformer.h.1.attn.c_attn.weight. holds nan at element 77" v.err &&
    { run bad -n 1 -- $GPT2 --data $DATA --steps 6 --accum 2 --save-dir N --resume; rc=$?; } && test $rc -ne 0 &&
    grep "^bmlaunch: job failed:" bad.err | grep -q "tensor .transformer.h.1.attn.c_attn.weight. holds nan at element 77: a checkpoint with non-finite values is refused" &&
    ! grep -q "^0: step" bad.out
'

test_expect_success "an optimizer state missing from a checkpoint (checksums made for it): --verify refuses it, naming file and tensor, as the resume does (--verify passed it)" '
    cp -r $TMP/G Q && $PY $TOOL drop Q/step-00000004 transformer.h.1.optim.safetensors transformer.h.1.attn.c_attn.weight.exp_avg_sq &&
    $PY $TOOL sums Q/step-00000004 >/dev/null &&
    { $GPT2 --verify Q 2>v.err; rc=$?; } && test $rc -eq 1 &&
    grep -q "transformer.h.1.optim.safetensors: no tensor .transformer.h.1.attn.c_attn.weight.exp_avg_sq.: the optimizer.s state of parameter .transformer.h.1.attn.c_attn.weight. is incomplete" v.err &&
    { run badq -n 1 -- $GPT2 --data $DATA --steps 6 --save-dir Q --resume; rc=$?; } && test $rc -ne 0 &&
    grep "^bmlaunch: job failed:" badq.err | grep -q "no tensor .transformer.h.1.attn.c_attn.weight.exp_avg_sq." &&
    ! grep -q "^0: step" badq.out
'

test_expect_success "an inf in the optimizer state of a checkpoint written before checksums: the load refuses it" '
    cp -r $TMP/G O && $PY $TOOL old O/step-00000004 && ! ls O/step-00000004/checksums-* 2>/dev/null &&
    $PY $TOOL plant O/step-00000004 transformer.optim.safetensors transformer.wte.weight.exp_avg_sq 3 inf &&
    { run bad -n 2 -- $GPT2 --data $DATA --steps 6 --save-dir O --resume; rc=$?; } && test $rc -ne 0 &&
    grep "^bmlaunch: job failed:" bad.err | grep -q "transformer.optim.safetensors: tensor .transformer.wte.weight.exp_avg_sq. holds inf at element 3" &&
    { $GPT2 --verify O 2>v.err; rc=$?; } && test $rc -eq 1 && grep -q "has no checksums" v.err
'

test_expect_success "a NaN planted in the parameters after step 3: the save of step 4 is refused on every rank, nothing is committed, latest and the good checkpoint stay (--keep 1)" '
    { BMT_FAULT=nan:1:3 run nan -n 2 -- $GPT2 --data $DATA --steps 6 --save-every 2 --keep 1 --save-dir K; rc=$?; } &&
    test $rc -ne 0 && grep -q "bmt: rank 1: BMT_FAULT: planting a NaN in a parameter after step 3" nan.err &&
    grep -q "^0: step   4/6 | loss nan .*(skipped)" nan.out &&
    grep "^bmlaunch: job failed:" nan.err | grep -q "holds nan at element [0-9]*: a checkpoint never holds a non-finite value, so nothing is saved" &&
    test "$(cat K/latest)" = step-00000002 && test "$(ls K)" = "$(printf "latest\nstep-00000002")" &&
    ! ls -a K | grep -q "^\.tmp" && $GPT2 --verify K >/dev/null
'

test_expect_success "--max-skipped 3: a run whose parameters hold a NaN stops at the fourth skipped step, exit status non-zero" '
    { BMT_FAULT=nan:0:2 run skip -g 2 -n 1 -- $GPT2 --data $DATA --steps 20 --max-skipped 3; rc=$?; } &&
    test $rc -ne 0 &&
    test $(grep -c "^0: step   [345]/20 | loss nan .*(skipped)" skip.out) -eq 3 && ! grep -q "^0: step   6/20" skip.out &&
    grep "^bmlaunch: job failed:" skip.err | grep -q "4 optimizer steps in a row were skipped (gradient norm nan, not finite), more than max_skipped 3: the run has diverged"
'

test_expect_success "the default bound (10) stops a diverged run too; --max-skipped 0 lets it run" '
    { BMT_FAULT=nan:0:1 run skip -n 1 -- $GPT2 --data $DATA --steps 40; rc=$?; } && test $rc -ne 0 &&
    grep "^bmlaunch: job failed:" skip.err | grep -q "11 optimizer steps in a row were skipped.* more than max_skipped 10" &&
    BMT_FAULT=nan:0:1 run skip0 -n 1 -- $GPT2 --data $DATA --steps 14 --max-skipped 0 &&
    grep -q "^0: step  14/14 | loss nan .*(skipped)" skip0.out
'

test_expect_success "a resume keeps the global batch: 2x2 (4 x 1 accum x 4 ranks) resumed on 1 rank derives --accum 4 and matches the 2x2 run" '
    cp -r $TMP/R R1 && echo step-00000002 >R1/latest && rm -rf R1/step-00000004 &&
    run b -n 1 -- $GPT2 --data $DATA --steps 4 --save-dir R1 --resume &&
    grep -q "^0: gpt2: --accum 4 keeps the checkpoint.s global batch (4 x 4 x 1 ranks sequences of 64 tokens)" b.out &&
    grep -q "^0: gpt2: .* batch 4 x 64 x 4 accum x 1 ranks = 1024 tokens/step" b.out &&
    $PY -c "
import re, sys
def loss(f, s):
    return float(re.search(r\"^0: step +%d/4 \\| loss ([0-9.]+)\" % s, open(f).read(), re.M).group(1))
for s in (3, 4):
    assert abs(loss(\"$TMP/a.out\", s) - loss(\"b.out\", s)) <= 2e-4, (s, loss(\"$TMP/a.out\", s), loss(\"b.out\", s))
"
'

test_expect_success "a resume that would change the global batch is refused with the options that keep it" '
    cp -r $TMP/R R2 && echo step-00000002 >R2/latest &&
    { run c -n 1 -- $GPT2 --data $DATA --steps 4 --save-dir R2 --resume --accum 2; rc=$?; } && test $rc -ne 0 &&
    grep "^bmlaunch: job failed:" c.err | grep -q "the checkpoint was trained on 16 sequences of 64 tokens per step (-b 4 -a 1 on 4 ranks); -b 4 with that -a on 1 ranks would make 8: resume with -b 4 -a 4" &&
    { run d -n 1 -- $GPT2 --data $DATA --steps 4 --save-dir R2 --resume -b 3; rc=$?; } && test $rc -ne 0 &&
    grep "^bmlaunch: job failed:" d.err | grep -q "resume with -b 2 -a 8" &&
    { run e -n 1 -- $GPT2 --data $DATA --steps 4 --save-dir R2 --resume -t 32; rc=$?; } && test $rc -ne 0 &&
    grep "^bmlaunch: job failed:" e.err | grep -q "this run has -t 32: resume with -t 64" &&
    { run f -n 3 -- $GPT2 --data $DATA --steps 4 --save-dir R2 --resume; rc=$?; } && test $rc -ne 0 &&
    grep "^bmlaunch: job failed:" f.err | grep -q "no -b and -a keep it on 3 ranks"
'

# The checkpoint records the optimizer's settings (train_state.json "optim");
# a resume with others would reshape the schedule from its step on unsaid.
test_expect_success "a resume with other optimizer settings (a decay's --steps, --lr, --clip) is refused naming both; --override-optim takes this run's and says so" '
    run o1 -n 1 -- $GPT2 --data $DATA --steps 4 --warmup 1 --lr-min-frac 0.1 --lr 2e-3 --save-every 2 --keep 0 --save-dir O &&
    $PY -c "import json; o = json.load(open(\"O/step-00000002/train_state.json\"))[\"user\"][\"optim\"]
assert o == {\"lr\": 2e-3, \"warmup\": 1, \"lr_min_frac\": 0.1, \"steps\": 4, \"weight_decay\": 0, \"clip\": 1}, o" &&
    echo step-00000002 >O/latest && cp -r O O0 &&
    { run o2 -n 1 -- $GPT2 --data $DATA --steps 8 --warmup 1 --lr-min-frac 0.1 --lr 2e-3 --save-dir O --resume; rc=$?; } && test $rc -ne 0 &&
    grep "^bmlaunch: job failed:" o2.err | grep -q "this run.s optimizer settings are not the checkpoint.s: --steps 8 (the checkpoint.s 4). A resume goes on with the checkpoint.s .*: give its values, or --override-optim to use this run.s" &&
    { run o3 -n 1 -- $GPT2 --data $DATA --steps 4 --warmup 1 --lr-min-frac 0.1 --lr 3e-4 --clip 0.5 --save-dir O --resume; rc=$?; } && test $rc -ne 0 &&
    grep "^bmlaunch: job failed:" o3.err | grep -q "settings are not the checkpoint.s: --lr 0.0003 (the checkpoint.s 0.002), --clip 0.5 (the checkpoint.s 1)\." &&
    diff -r O O0 &&
    run o4 -n 1 -- $GPT2 --data $DATA --steps 8 --warmup 1 --lr-min-frac 0.1 --lr 2e-3 --save-dir O --resume --override-optim &&
    grep -q "^0: gpt2: --override-optim: --steps 8 (the checkpoint.s 4)$" o4.out &&
    grep -q "^0: step   3/8 | loss [0-9.]* | lr 1.66e-03 " o4.out &&
    $PY -c "import json; assert json.load(open(\"O/step-00000008/train_state.json\"))[\"user\"][\"optim\"][\"steps\"] == 8" &&
    { $GPT2 --data $DATA --steps 4 --override-optim >o5.out 2>&1; rc=$?; } && test $rc -eq 2 &&
    grep -q "^gpt2: --override-optim chooses between .*: it needs --resume" o5.out
'

test_expect_success "without a decay --steps places nothing: a constant-rate run resumes with more steps" '
    cp -r $TMP/R R3 && echo step-00000004 >R3/latest &&
    run o6 -g 2 -n 2 -- $GPT2 --data $DATA --steps 6 --save-dir R3 --resume &&
    grep -q "^0: gpt2: resumed from R3/step-00000004 (step 4)" o6.out && grep -q "^0: step   6/6 " o6.out &&
    ! grep -q override-optim o6.out
'

test_expect_success "stale .tmp- directories of crashed saves go at a resume and at a save of another name; a directory of other files stays" '
    cp -r $TMP/G S && mkdir -p S/.tmp-step-00000099 S/.tmp-step-00000098 S/.tmp-mine &&
    head -c 100000 /dev/zero >S/.tmp-step-00000099/transformer.h.0.safetensors &&
    echo "{}" >S/.tmp-step-00000099/train_state.json.tmp && echo notes >S/.tmp-mine/notes.txt &&
    run s -n 2 -- $GPT2 --data $DATA --steps 4 --save-dir S --resume &&
    test "$(ls -a S | grep "^\.tmp")" = .tmp-mine && test -f S/.tmp-mine/notes.txt &&
    mkdir -p S/.tmp-step-00000042 && run s2 -n 1 -- $TC save S && test -f S/ck/train_state.json &&
    test "$(ls -a S | grep "^\.tmp")" = .tmp-mine
'

test_expect_success "errors are not cut at 160 characters: a 400-character path is named whole" '
    long=$PWD/$(printf "d%.0s" $(seq 200))/$(printf "e%.0s" $(seq 200)) && mkdir -p $long &&
    cp -r $TMP/G/step-00000004 $long/ck && echo ck >$long/latest && rm $long/ck/transformer.h.3.safetensors &&
    { run l -n 1 -- $GPT2 --data $DATA --steps 6 --accum 2 --save-dir $long --resume; rc=$?; } && test $rc -ne 0 &&
    grep "^bmlaunch: job failed:" l.err | grep -qF "$long/ck/transformer.h.3.safetensors: cannot open: No such file or directory" &&
    { $GPT2 --verify $long/ck 2>v.err; rc=$?; } && test $rc -eq 1 &&
    grep -qF "$long/ck/transformer.h.3.safetensors: cannot open: No such file or directory" v.err
'

# Real file systems in a mount namespace of their own (unshare -m: the mounts
# go with it, however the test ends): root only.
if [ "$(id -u)" -ne 0 ] || ! unshare -m sh -c "mkdir -p $TMP/mnt && mount -t tmpfs -o size=64k tmpfs $TMP/mnt" 2>/dev/null; then
    echo "# skipped: the three tmpfs tests (full, filled at each file of a save, made read-only): not root, or mount failed"
else
test_expect_success "a save on a full file system (a real 200 KB tmpfs): bmlaunch's summary names No space left on device, 4 runs of 4, and nothing is left behind" '
    mkdir -p full &&
    for i in 1 2 3 4; do
        { unshare -m sh -c "mount -t tmpfs -o size=200k tmpfs full &&
            $BMLAUNCH --metrics-port 0 -g 2 -n 2 -- $GPT2 --data $DATA --steps 4 --save-every 2 --save-dir full;
            echo \"exit \$?\" >&2; ls -a full >&2" >full.out 2>full.err; } || true
        grep -q "^exit 1$" full.err && grep "^bmlaunch: job failed:" full.err | grep -q "No space left on device" &&
        ! grep -q "^\.tmp-" full.err || { cat full.err; exit 1; }
    done
'

# fill_at K (in a mount namespace): a tmpfs holding a copy of G (latest
# step-00000004) with room for one more save's model and optimizer files and
# K pages more (each small file takes one page); a 1x2 run resumes to step 5.
# Prints its exit status, latest, the directory, whether --verify passed, and
# bmlaunch's summary.
fill_at() {
    local m=$PWD/mnt rc=0 bs free big=0 f
    mkdir -p $m && mount -t tmpfs -o size=16m tmpfs $m || return 9
    cp -r $TMP/G $m/ck && bs=$(stat -f -c %S $m) && free=$(stat -f -c %a $m) &&
        for f in $m/ck/step-00000004/*.safetensors; do big=$((big + ($(stat -c %s $f) + bs - 1) / bs)); done &&
        fallocate -l $(((free - big - $1) * bs)) $m/filler || return 9
    with_timeout 100 $BMLAUNCH --metrics-port 0 -n 2 -- $GPT2 --data $DATA --steps 5 --save-dir $m/ck --resume >fill.out 2>fill.err || rc=$?
    rm $m/filler
    echo "exit $rc"
    echo "latest $(cat $m/ck/latest)"
    echo "entries $(ls -a $m/ck | tr "\n" " ")"
    $GPT2 --verify $m/ck >/dev/null 2>&1 && echo verified
    grep "^bmlaunch: job failed:" fill.err
    return 0
}
export -f fill_at with_timeout
export GPT2 DATA TMP

test_expect_success "out of space at each file of a save after the preallocated ones (each rank.s checksums, the index, config.json, train_state.json, latest.tmp; a tmpfs filled to the page): every run fails naming it, latest and its checkpoint stay whole, nothing is left" '
    for k in -1 0 1 2 3 4 5 6 7; do
        unshare -m bash -c "fill_at $k" >r$k || { cat r$k fill.err; exit 1; }
        if grep -qx "exit 0" r$k; then
            grep -qx "latest step-00000005" r$k && grep -qx verified r$k || { cat r$k; exit 1; }
            continue
        fi
        grep -qx "exit 1" r$k && grep -qx "latest step-00000004" r$k && grep -qx verified r$k &&
            grep -qx "entries \. \.\. \.lock latest step-00000002 step-00000004 " r$k &&
            grep -q "cannot \(create\|write\) [^ ]*: No space left on device" r$k || { cat r$k; exit 1; }
        sed -n "s#.*cannot \(create\|write\) [^ ]*/\([^/ ]*\): No space left on device.*#\2#p" r$k >>named
    done &&
    grep -qx "exit 0" r7 && cat named &&
    for f in "checksums-0000[01].json.tmp" model.safetensors.index.json.tmp config.json.tmp train_state.json.tmp latest.tmp; do
        grep -qx "$f" named || { echo "no run failed at $f"; exit 1; }
    done
'

# Read-only under a running job: a read-only bind mount over its --save-dir
# (the file system itself cannot be remounted read-only while the trainer
# holds DIR/.lock open for writing: mount says busy).
test_expect_success "the --save-dir made read-only after a save (a read-only bind mount): the next save fails naming the directory, latest and its checkpoint stay, a resume goes on from it" '
    unshare -m bash -c "mkdir mnt && mount -t tmpfs -o size=16m tmpfs mnt &&
        { $BMLAUNCH --metrics-port 0 -n 2 -- $GPT2 --data $DATA --steps 400 --save-every 2 --save-dir mnt/ck >ro.out 2>ro.err & }
        pid=\$!
        for i in \$(seq 600); do grep -q saved ro.out && break; sleep 0.05; done
        mount --bind mnt/ck mnt/ck && mount -o remount,bind,ro mnt/ck || kill \$pid
        rc=0; wait \$pid || rc=\$?; echo \"exit \$rc\" >ro.rc
        cat mnt/ck/latest >ro.latest; ls -a mnt/ck >ro.ls; $GPT2 --verify mnt/ck >ro.v 2>&1
        umount mnt/ck && $BMLAUNCH --metrics-port 0 -n 2 -- $GPT2 --data $DATA --steps \$((\$(sed -n \"s/^step-0*//p\" ro.latest) + 1)) --save-dir mnt/ck --resume >re.out 2>&1" &&
    cat ro.rc && grep -qx "exit 1" ro.rc && s=$(cat ro.latest) &&
    test "$(sed -n "s|^0: gpt2: saved mnt/ck/||p" ro.out | tail -1)" = $s &&
    grep "^bmlaunch: job failed:" ro.err | grep -q "cannot create mnt/ck/\.tmp-step-[0-9]*: Read-only file system" &&
    grep -qx "$s" ro.ls && ! grep -q "^\.tmp" ro.ls && grep -q ": ok: step" ro.v &&
    grep -q "^0: gpt2: resumed from mnt/ck/$s" re.out
'
fi

# A save directory whose parent moved away mid-run (the trainer still holds
# the directory it locked, but a save goes by its path).
test_expect_success "the --save-dir's parent renamed mid-run: the next save fails naming the directory; the moved checkpoints stay whole" '
    mkdir -p a && { BMT_TIMEOUT=60 $BMLAUNCH --metrics-port 0 -n 2 -- $GPT2 --data $DATA --steps 400 --save-every 2 --save-dir a/ck >v.out 2>v.err & }
    pid=$!
    for i in $(seq 600); do grep -q saved v.out && break; sleep 0.05; done
    mv a gone
    rc=0; wait $pid || rc=$?
    test $rc -eq 1 && s=$(cat gone/ck/latest) &&
    grep "^bmlaunch: job failed:" v.err | grep -q "cannot create a/ck: No such file or directory" &&
    test -d gone/ck/$s && ! ls -a gone/ck | grep -q "^\.tmp" && $GPT2 --verify gone/ck >/dev/null
'

test_expect_success "ranks that run different numbers of micro-batches are refused at once, naming the rank (2x1, 1x2, 2x2)" '
    for lay in "-g 2 -n 1" "-g 1 -n 2" "-g 2 -n 2"; do
        { run mm $lay -- sh -c "exec $GPT2 --data $DATA --steps 3 --accum \$((1 + BMT_RANK % 2))"; rc=$?; } &&
        test $rc -ne 0 || exit 1
        grep "^bmlaunch: job failed:" mm.err | grep -q "the ranks ran different numbers of micro-batches in this step: micro-batch 1 is .*rank [0-3].s; every rank must call bmt_blocklist_backward equally often" || { cat mm.err; exit 1; }
        ! grep -q "^0: step" mm.out || exit 1
    done
'

# A file-size limit (ulimit -f; Slurm propagates the submitting shell's) used
# to kill the rank with SIGXFSZ at the first file over it: exit 153, no file
# named, the other ranks told only that it died.
test_expect_success "a file-size limit (ulimit -f) at a save: the run fails with exit 1 naming the file and File too large, the previous checkpoint stays whole" '
    cp -r $TMP/G X && rm -rf X/step-00000004 && echo step-00000002 >X/latest &&
    { run fsz -n 1 -- bash -c "ulimit -f 300 && exec $GPT2 --data $DATA --steps 3 --save-dir X --resume"; rc=$?; } &&
    test $rc -eq 1 &&
    grep "^bmlaunch: job failed:" fsz.err | grep -q "checkpoint X/step-00000003: cannot create X/.tmp-step-00000003/transformer.h.0.optim.safetensors: File too large" &&
    test "$(cat X/latest)" = step-00000002 && test "$(ls -a X | tr "\n" " ")" = ". .. .lock latest step-00000002 " &&
    $GPT2 --verify X >/dev/null || { echo "exit $rc"; cat fsz.err; ls -a X; exit 1; }
'

# Error paths a healthy machine never takes, through tests/plugins/failio.so
# (LD_PRELOAD; it does not mix with sanitizer builds, which replace malloc).
if grep -q "SAN=1" "$BUILDDIR/.knobs" 2>/dev/null; then
    echo "# skipped: the failio.so tests (a sanitizer build: $(cat "$BUILDDIR/.knobs"))"
else
    FAILIO=$BUILDDIR/tests/plugins/failio.so
    export FAILIO
    test_expect_success "an fsync that fails (EIO, injected): the save fails on every rank naming file and cause, and the writers close their files" '
        test -f $FAILIO &&
        { run f -n 2 -- env LD_PRELOAD=$FAILIO BMT_TEST_FAIL_FSYNC=.safetensors $TC save-fails .; rc=$?; } &&
        test $rc -eq 3 &&
        grep -q "^[0-9]*: trust_check: refused: .*cannot fsync .*/\.tmp-ck/b\.[0-9]\.\(optim\.\)\?safetensors: Input/output error" f.out &&
        grep -q "^[0-9]*: trust_check: fds \([0-9]*\) \1$" f.out &&
        ! grep "trust_check: fds " f.out | grep -qv "fds \([0-9]*\) \1$" && ! test -e ck && ! ls -a | grep -q "^\.tmp"
    '
    # The directory's fsync after the renames: DIR/latest already names the
    # new checkpoint, so the error must say so (it said "cannot fsync DIR",
    # which read as a save that left nothing), and the one it replaced is gone.
    test_expect_success "the directory's fsync after the renames fails (EIO, injected): the save fails on every rank saying the checkpoint is in and latest names it" '
        test -f $FAILIO && mkdir E && run ok -n 2 -- $TC save E && test "$(cat E/latest)" = ck &&
        { run fd -n 2 -- env LD_PRELOAD=$FAILIO BMT_TEST_FAIL_FSYNC_DIR=/E $TC save-fails E; rc=$?; } &&
        test $rc -eq 3 &&
        grep -q "^0: trust_check: refused: .*E/ck is written and E/latest names it, but the fsync of E after the renames failed: Input/output error; a crash before the file system recovers may lose them (check the file system before trusting E)" fd.out &&
        grep -q "^1: trust_check: refused: .*failed on rank 0: .*E/ck is written and E/latest names it" fd.out &&
        test "$(cat E/latest)" = ck && test -f E/ck/train_state.json && ! ls -a E | grep -q "^\.tmp" &&
        $BUILDDIR/bin/gpt2 --verify E >v.out 2>&1 || { cat v.out; exit 1; }
    '
    # --keep removes an old checkpoint file by file: a crash after its
    # train_state.json went used to leave the rest (2.7 MiB here) as a step
    # directory that no later prune or sweep removed.
    test_expect_success "a crash while --keep removes an old checkpoint (SIGKILL after its train_state.json went, injected): the next save removes what is left" '
        test -f $FAILIO && cp -r $TMP/G P &&
        { run pk -n 1 -- env LD_PRELOAD=$FAILIO BMT_TEST_KILL_UNLINK=/train_state.json $GPT2 --data $DATA --steps 5 --save-dir P --resume --keep 1; rc=$?; } &&
        test $rc -eq 137 && test "$(cat P/latest)" = step-00000005 &&
        $GPT2 --verify P >/dev/null &&
        run pk2 -n 1 -- $GPT2 --data $DATA --steps 6 --save-dir P --resume --keep 1 &&
        test "$(ls -a P | tr "\n" " ")" = ". .. .lock latest step-00000006 " || { ls -la P; exit 1; }
    '
    test_expect_success "a name that cannot be allocated (ENOMEM, injected): the save fails, it does not write a header without that tensor" '
        test -f $FAILIO && run ok -n 1 -- $TC long-name . && test -f ck/train_state.json && rm -rf ck &&
        { run m -n 1 -- env LD_PRELOAD=$FAILIO BMT_TEST_FAIL_MALLOC=1013:1 $TC save-fails .; rc=$?; } &&
        test $rc -eq 3 &&
        grep -q "^0: trust_check: refused: .*out of memory naming the tensors of block b.1" m.out &&
        ! test -e ck && ! ls -a | grep -q "^\.tmp"
    '
fi

for m in seed-rank name-rank init-rank shape-rank; do
    case $m in
    seed-rank) what="build seeds (or whether it was loaded)" ;;
    name-rank) what="parameter names" ;;
    init-rank) what="initializations (kind, arguments, flags)" ;;
    shape-rank) what="parameter shapes or dtypes" ;;
    esac
    test_expect_success "ranks whose blocks differ ($m) are refused at the first forward, naming block and aspect" "
        { run tc -g 2 -n 2 -- \$TC $m .; rc=\$?; } && test \$rc -eq 3 &&
        grep -q \"^[0-9]*: trust_check: refused: rank [0-9]*: the ranks' block lists differ: block 0 ('b.0') was built differently, its $what differ across ranks\" tc.out
    "
done

test_expect_success "the same blocks everywhere are accepted; so are per-rank seeds when every rank then loads the same values" '
    run ok -g 2 -n 2 -- $TC same . && grep -q "^0: trust_check: accepted" ok.out &&
    run sv -n 2 -- $TC save . && run ld -g 2 -n 2 -- $TC loaded-seed . && grep -q "^0: trust_check: accepted" ld.out
'

test_expect_success "a checkpoint with an extra block, a missing block or an extra tensor is refused; a second optimizer, a NULL shape and an unknown AdamW config version too (version 1 still works)" '
    run sv -n 2 -- $TC save . &&
    { run x -n 2 -- $TC extra-block .; rc=$?; } && test $rc -eq 3 &&
    grep -q "has block .b.2., which the model does not have (the checkpoint has 3 blocks, the model 2)" x.out &&
    { run x -n 2 -- $TC missing-block .; rc=$?; } && test $rc -eq 3 && grep -q "has no block .b.3." x.out &&
    { run x -n 2 -- $TC extra-tensor .; rc=$?; } && test $rc -eq 3 &&
    grep -q "b.1.safetensors has tensor .b.1.v., which block b.1 of the model does not have" x.out &&
    { run x -n 2 -- $TC adamw-twice .; rc=$?; } && test $rc -eq 3 &&
    grep -q "bmt_adamw_create: this block list already has an optimizer" x.out &&
    { run x -n 1 -- $TC null-shape .; rc=$?; } && test $rc -eq 3 && grep -q "b.0.w: the shape is NULL" x.out &&
    { run x -n 1 -- $TC adamw-v1 .; rc=$?; } && test $rc -eq 3 &&
    grep -q "the config was not set up with BMT_ADAMW_CONFIG_INITIALIZER of this bmt" x.out
'

# Edge cases of the public API (tests/progs/api_check.c, one rank without
# bmlaunch): a SIZE_MAX allocation, NULLs into bmt_all_reduce_host_f64 and
# bmt_ckpt_save_async, a checkpoint path that does not fit its buffer, a
# refused save that leaves no directory behind, a failed optimizer step that
# counts nothing, a long name in an error; and the none backend's refusal
# that leaves the communicator usable.
test_expect_success "the public API's edge cases: -1 with a message and nothing changed (api_check)" '
    with_timeout 60 "$PROGS/api_check" >out 2>&1 || { cat out; false; } &&
    cat out && grep -q "^api_check: 59 passed, 0 failed" out &&
    grep -q "bmt: rank 0: bmt_finalize: 1 block list(s) and 1 optimizer(s) not destroyed: destroy them first; nothing was finalized" out
'

# Each rank applies AdamW to its own shards: ranks with other settings would
# train a model that no rank holds whole, and nothing else would notice.
test_expect_success "ranks whose optimizer settings differ (a schedule, a weight decay): the first step fails on every rank, naming the setting" '
    { with_timeout 60 "$BMLAUNCH" --metrics-port 0 -g 2 -n 2 -- "$PROGS/api_check" settings >out 2>&1; rc=$?; } &&
    cat out && test $rc -eq 0 &&
    test $(grep -c "^[0-3]: api_check: 4 passed, 0 failed" out) -eq 4 &&
    grep -q "^0: ok 2 - .*weight_decay is 0.01 on some and 0.1 on others (this rank 0.01)" out &&
    grep -q "^3: ok 2 - .*weight_decay is 0.01 on some and 0.1 on others (this rank 0.1)" out
'

test_expect_success "BMT_BACKEND=none: a refused collective does not abort the communicator (api_check none)" '
    BMT_BACKEND=none with_timeout 60 "$PROGS/api_check" none >out 2>&1 || { cat out; false; } &&
    cat out && grep -q "^api_check: 5 passed, 0 failed" out
'

test_done
