#!/bin/bash
# The training engine (bmt/block.h, bmt/optim.h) through the real bmlaunch on CPU
# ranks (shm backend): engine_check builds a small model of sharded blocks,
# trains it and compares it with its own single-process reference (fp64 model
# and torch.optim.AdamW), checks the memory counters against this rank's shard
# sizes, and tries misuse. It prints "ok ..." / "FAIL ..." per check and exits 1
# on any failure; rank 0's last line sums up every rank.
. "$(dirname "$0")/lib.sh"

EC=$PROGS/engine_check
# ec RANKS BMLAUNCH-ARGS... -- engine_check ARGS...: run it (output in out, err)
# and pass if it exits 0 with rank 0's summary saying nothing failed on RANKS
# ranks; otherwise show why (the harness prints a failing body's output).
ec() {
    local n=$1 rc=0
    shift
    with_timeout 150 "$BMLAUNCH" "$@" >out 2>err || rc=$?
    if [ $rc -eq 0 ] && grep -q "^0: engine_check: [0-9]* checks passed, 0 failed on $n ranks" out &&
        ! grep -q FAIL out; then
        return 0
    fi
    echo "exit status $rc"
    grep -E "FAIL|engine_check" out | head -20
    tail -5 err
    return 1
}

for layout in 1x1 1x4 2x2 4x1 2x4; do
    g=${layout%x*} n=${layout#*x}
    test_expect_success "engine ${g}x${n}: init, 20 steps x 2 micro-batches match the reference, memory, misuse" "
        ec $((g * n)) -g $g -n $n --timeout 60 -- \$EC --init-dump \$TMP/init.$layout &&
        grep -q '^0: ok train (zero 3, ckpt 1): head.out.weight .* within 1e-05 of the reference after 20 steps' out &&
        test \$(grep -c '^0: ok bad use' out) -eq 23 &&
        if [ $n -eq 1 ]; then
            grep -q '^0: ok memory (zero 3, ckpt 1): a group of one computes on its shards in place: no gathered buffer (peak 0)' out &&
            grep -q '^0: ok memory (zero 3, ckpt 1): no full gradient buffers in a group of one (peak 0)' out
        else
            grep -q '^0: ok memory (zero 3, ckpt 1): peak of gathered buffers in training [1-9][0-9]* <= K = 2 blocks' out &&
            grep -q '^0: ok memory (zero 3, ckpt 1): peak of full gradient buffers [1-9][0-9]* <= two successive blocks = [0-9]* (two of the largest: [0-9]*); 0 after training' out
        fi
    "
done

test_expect_success "initial parameters are bitwise identical in layouts 1x1, 1x4, 2x2, 4x1, 2x4" '
    test $(grep -c "^h\.1\.fc\.weight f32 377 " $TMP/init.1x1) -eq 1 &&
    test $(wc -l <$TMP/init.1x1) -eq 23 &&
    for l in 1x4 2x2 4x1 2x4; do cmp $TMP/init.1x1 $TMP/init.$l; done
'

test_expect_success "zero level 2 and 3, checkpointing on, off and per use, the update deferred or not give the same parameters (2x2)" '
    ec 4 -g 2 -n 2 --timeout 60 -- $EC --variants &&
    test $(grep -c "^0: ok variants: " out) -eq 6 &&
    grep -q "^0: ok variants: overwrite 1 gives the same parameters as overwrite 0, bitwise" out &&
    grep -q "^0: ok variants: zero 3 ckpt 2 agrees with zero 3 ckpt 1: .*(bitwise equal)" out &&
    grep -q "^0: ok protocol (zero 3, ckpt 2): [0-9]* callback calls" out &&
    test $(grep -c "^0: ok ckpt 2: use [0-5].s checkpointing reads back [01]" out) -eq 6 &&
    grep -q "^0: ok variants: overlap 0 gives the same parameters as overlap 1, bitwise" out &&
    grep -q "^0: ok memory (zero 3, ckpt 1, overlap 0): grad bytes 0 after the step (none: given back)" out &&
    grep -q "^0: ok memory (zero 3, ckpt 1): grad bytes [1-9][0-9]* after the step (all: the update is deferred to the next gather)" out &&
    grep -q "^0: ok protocol (zero 3, ckpt 0): 480 callback calls" out &&
    grep -q "^0: ok memory (zero 2, ckpt 1): peak of gathered buffers in training [0-9]* <= every block" out
'

# bmt_blocklist_set_grad_overwrite: fresh gradients are not zeroed but left to
# callbacks that write them; BMT_CHECK_OVERWRITE=1 fills them with NaN first.
for layout in 1x1 2x2; do
    g=${layout%x*} n=${layout#*x}
    test_expect_success "fresh gradients overwritten by the callbacks, NaN-filled first ($layout): the reference's numbers, every variant bitwise" "
        BMT_CHECK_OVERWRITE=1 ec $((g * n)) -g $g -n $n --timeout 60 -- \$EC --overwrite 1 --variants &&
        grep -q '^0: ok protocol (zero 3, ckpt 1): 720 callback calls as the header describes' out &&
        grep -q '^0: ok train (zero 3, ckpt 1): head.out.weight .* within 1e-05 of the reference after 20 steps' out &&
        grep -q '^0: ok variants: overwrite 0 gives the same parameters as overwrite 1, bitwise' out &&
        test \$(grep -c '^0: ok variants: ' out) -eq 6
    "
done

test_expect_success "a model that adds into gradients the list left to it is caught by BMT_CHECK_OVERWRITE=1 (1x1, 2x2)" '
    ! BMT_CHECK_OVERWRITE=1 with_timeout 60 $BMLAUNCH -g 1 -n 1 --timeout 30 -- $EC --overwrite 2 >out 2>err &&
    grep -q "^0: FAIL .*gradient norm -\{0,1\}nan, not finite" out &&
    ! BMT_CHECK_OVERWRITE=1 with_timeout 60 $BMLAUNCH -g 2 -n 2 --timeout 30 -- $EC --overwrite 2 >out 2>err &&
    grep -q "^0: FAIL .*gradient norm -\{0,1\}nan, not finite" out
'

test_expect_success "BMT_CHECK_OVERWRITE other than 0 or 1 fails the list's creation, naming the value" '
    ! BMT_CHECK_OVERWRITE=yes with_timeout 60 $BMLAUNCH -g 1 -n 1 --timeout 30 -- $EC --overwrite 1 >out 2>err &&
    grep -q "bmt_blocklist_create: BMT_CHECK_OVERWRITE=.yes. is not 0 or 1" out
'

test_expect_success "gradient clipping and a warm-up schedule (2x4)" '
    ec 8 -g 2 -n 4 --timeout 60 -- $EC --clip 0.3 --warmup 5 &&
    grep -q "^0: ok train (zero 3, ckpt 1): clip_norm 0.3 binds in [1-9][0-9]* of 20 steps" out
'

test_expect_success "gradients reduce-scattered in bf16 (2x2): within a bf16 bound of the reference" '
    ec 4 -g 2 -n 2 --timeout 60 -- $EC --reduce-dtype bf16 --bound 3e-2 &&
    grep -q "^0: ok memory (zero 3, ckpt 1): peak of full gradient buffers [0-9]* <= two successive blocks + a bf16 copy of the largest = [0-9]* (two of the largest: [0-9]*); 0 after training" out &&
    grep -q "^0: ok train (zero 3, ckpt 1): head.out.weight .* within 3e-02 of the reference" out
'

test_expect_success "ranks whose block lists (or one use's checkpointing) differ are refused at the first forward, on every rank (1x4)" '
    with_timeout 60 $BMLAUNCH -g 1 -n 4 --timeout 30 -- $EC --mismatch >out 2>err &&
    test $(grep -c "engine_check: mismatch: [1-9][0-9]* passed, 0 failed on rank" out) -eq 4 &&
    grep -q "^0: ok mismatch: ranks with different prefetch settings .*the ranks. block lists differ" out &&
    grep -q "^0: ok mismatch: ranks with different checkpointing of one use .*the ranks. block lists differ" out
'

test_expect_success "a step whose gradients are NaN is skipped and counted (1x4, zero 2)" '
    ec 4 -g 1 -n 4 --timeout 60 -- $EC --nan-step 7 --zero 2 &&
    grep -q "^0: ok train (zero 2, ckpt 1): the step with NaN gradients (7) was skipped" out
'

test_expect_success "bf16 parameters with f32 master weights (2x2, bound 2e-2)" '
    ec 4 -g 2 -n 2 --timeout 60 -- $EC --dtype bf16 --init-dump init.bf16 &&
    grep -q "^0: ok memory (zero 3, ckpt 1): optim bytes [0-9]* (peak [0-9]*) = 3 (moments, master)" out &&
    test $(grep -c " bf16 " init.bf16) -eq 22
'

test_expect_success "no prefetch, 3 micro-batches, checkpointing off (4x1)" '
    ec 4 -g 4 -n 1 --timeout 60 -- $EC --prefetch 0 --accum 3 --ckpt 0 --steps 8
'

test_expect_success "the checker can fail: an impossible bound fails the run" '
    test_must_fail with_timeout 150 $BMLAUNCH -g 1 -n 2 --timeout 60 -- $EC --steps 2 --bound 1e-15 >out 2>err &&
    grep -q "^0: FAIL (rank 0) train (zero 3, ckpt 1): h.0.fc.weight" out &&
    grep -q "^0: engine_check: [0-9]* checks passed, [1-9][0-9]* failed on 2 ranks" out
'

test_expect_code 2 "a bad option is a usage error" '
    $EC --zero 4 2>err
'

test_expect_success "a rank that dies before attaching to the world segment: bmlaunch removes the job's segments from /dev/shm" '
    rm -f jobid.* &&
    # rank 1 gets through the comparison of settings in bmt_init
    # (a rank that never starts is caught there, before any segment exists),
    # then fails before it attaches; its shell lives on for a second
    test_must_fail with_timeout 90 $BMLAUNCH --metrics-port 0 -n 3 -- sh -c "echo \$BMT_JOB_ID >jobid.\$BMT_RANK; if test \$BMT_RANK = 1; then BMT_SHM_CHUNK=lots $EC --steps 1; sleep 1; exit 3; fi; exec $EC --steps 1" >out 2>&1 &&
    grep -q "^1: .*BMT_SHM_CHUNK=.lots. is not a byte count" out &&
    grep -q "rank 1 (pid [0-9]* on .*) exited with code 3" out &&
    h=$(/usr/bin/python3 -c "
import os, sys
h = 0xcbf29ce484222325
for b in open(sys.argv[1]).read().strip().encode():
    h = ((h ^ b) * 0x100000001b3) & (2**64 - 1)
print(\"%016x\" % (h ^ (os.getuid() << 32) & (2**64 - 1)))
" jobid.0) && echo "job hash $h" &&
    ! ls /dev/shm | grep "^bmt-$h-"
'

# A segment no process maps is left behind. One that a process maps belongs
# to a job still running (another suite's, at the same moment); one seen
# unmapped is looked at again 2 s later, past a rendezvous's instant between
# shm_open and mmap.
unmapped_segments() {
    for f in "$@"; do
        [ -e "$f" ] && ! grep -qsF "$f" /proc/[0-9]*/maps && echo "$f"
    done
    return 0
}
test_expect_success "no shared-memory segment is left behind" '
    left=$(unmapped_segments /dev/shm/bmt-*) &&
    { [ -z "$left" ] || { sleep 2; left=$(unmapped_segments $left); }; } &&
    { [ -z "$left" ] || { echo "left behind: $left"; exit 1; }; }
'

# A tied block (bmt_blocklist_append_tied: GPT-2's embedding reused as the LM
# head; in a group of one both uses add into the shard itself, over 3
# micro-batches in the last run): tied_check compares one AdamW step that moves every parameter by -g
# with an fp64 reference of both uses' gradients, and the pool's peak.
for layout in 1x1 1x2 2x1 2x2; do
    g=${layout%x*} n=${layout#*x}
    test_expect_success "tied block ${g}x${n}: both uses' gradients reach the shard once, every zero level and schedule, 3 micro-batches" "
        for z in 2 3; do for pf in 0 1; do for ck in 0 1; do
            with_timeout 60 \$BMLAUNCH --metrics-port 0 -g $g -n $n --timeout 30 -- \$PROGS/tied_check \
                --zero \$z --prefetch \$pf --ckpt \$ck >out 2>err || { cat out err; exit 1; }
            grep -q '^0: tied_check: all checks passed on $((g * n)) ranks' out || { cat out; exit 1; }
            ! grep -q FAIL out || { cat out; exit 1; }
        done; done; done &&
        with_timeout 60 \$BMLAUNCH --metrics-port 0 -g $g -n $n --timeout 30 -- \$PROGS/tied_check \
            --accum 3 >out 2>err || { cat out err; exit 1; }
        grep -q '^0: tied_check: all checks passed on $((g * n)) ranks (zero 3, ckpt 1, prefetch 1, accum 3)' out &&
        grep -q '^0: ok (rank 0) every backward call.s grads_fresh as the header says (0 calls not; overwrite 0)' out &&
        BMT_CHECK_OVERWRITE=1 with_timeout 60 \$BMLAUNCH --metrics-port 0 -g $g -n $n --timeout 30 -- \$PROGS/tied_check \
            --accum 3 --overwrite 1 >out 2>err || { cat out err; exit 1; }
        grep -q '^0: tied_check: all checks passed on $((g * n)) ranks (zero 3, ckpt 1, prefetch 1, accum 3, overwrite)' out
    "
done

# mo_same G N [ARGS...]: train bf16 at GxN (with engine_check ARGS) keeping the
# bf16 shards (output in out.keep, checkpoint in keep/) and under master_only
# (out, mo/), and pass if the trained parameters (rank 0's hash) and every
# checkpoint file are the same.
mo_same() {
    local g=$1 n=$2 h1 h2
    shift 2
    ec $((g * n)) -g $g -n $n --timeout 60 -- $EC --dtype bf16 --ckpt-dir $PWD/keep --ckpt-at 12 "$@" &&
        mv out out.keep &&
        ec $((g * n)) -g $g -n $n --timeout 60 -- $EC --dtype bf16 --ckpt-dir $PWD/mo --ckpt-at 12 \
            --master-only "$@" || return 1
    grep -q "^0: ok memory (.*): param bytes 0 (peak 0) = none (master_only)" out &&
        h1=$(sed -n "s/^0: ok ckpt .*(hash \([0-9a-f]*\))$/\1/p" out.keep) &&
        h2=$(sed -n "s/^0: ok ckpt .*(hash \([0-9a-f]*\))$/\1/p" out) &&
        echo "trained parameters: $h1 (bf16 shards kept), $h2 (master_only)" &&
        test -n "$h1" && test "$h1" = "$h2" || return 1
    local f
    for f in keep/ec/*; do cmp "$f" "mo/ec/${f##*/}" || return 1; done
}

# master_only (bmt/optim.h): the optimizer's f32 masters are the only copy of
# bf16 values; gathers round them. The same bits and checkpoint files as keeping
# the bf16 shards; no parameter bytes while training; the shards come back when
# the optimizer goes.
test_expect_success "master_only (bf16, 2x2): no parameter shards while training, bitwise the same run and checkpoint files, shards back at destroy" '
    mo_same 2 2 &&
    grep -q "^0: ok master_only 1 (.*): a second optimizer on the list is refused" out &&
    grep -q "^0: ok master_only (.*): creating the optimizer peaks at [0-9]* bytes <= " out &&
    grep -q "^0: ok master_only (.*): a checkpoint load without the optimizer that holds the values is refused" out &&
    grep -q "^0: ok master_only (.*): after bmt_optim_destroy the blocks hold the optimizer.s values, bitwise" out &&
    grep -q "^0: ok master_only (.*): bmt_optim_destroy gives the blocks [0-9]* bytes of shards back" out
'

# In a group of one (no all-gather) the forward's deferred update writes the
# rounded values straight into the block's gathered buffer, in the pass that
# updates the master (schedule.c, update_into_slot), instead of the gather
# reading the master again: the same bits as keeping the bf16 shards, which
# the layers compute on in place. Zero level 2 (a buffer per block) and no
# prefetch (one buffer) reuse the pool's buffers differently.
for v in "4x1:" "1x1:" "4x1:--prefetch 0" "1x1:--zero 2 --ckpt 0"; do
    layout=${v%%:*} extra=${v#*:}
    g=${layout%x*} n=${layout#*x}
    test_expect_success "master_only (bf16, ${g}x${n}${extra:+, }${extra}, update deferred): the update writes the gathered values; bitwise the same run and checkpoint files" "
        mo_same $g $n $extra
    "
done

test_expect_success "master_only with zero level 2 and no activation checkpointing (1x4, bf16)" '
    ec 4 -g 1 -n 4 --timeout 60 -- $EC --dtype bf16 --zero 2 --ckpt 0 --master-only &&
    grep -q "^0: ok memory (zero 2, ckpt 0): param bytes 0 (peak 0)" out
'

# master_only 2, the split master (bmt/optim.h): each bf16 master kept as the
# bf16 shard (its high half, rounded to nearest with ties away from zero) and
# its low 16 bits, no f32 copy. The run is engine_check's (the fp64 reference,
# memory: 2.5 f32 shards of optimizer state, no gathered buffer in a group of
# one, the step-12 rewind bitwise through checkpoints that hold the joined
# masters, a load without the optimizer refused). Against the run that keeps
# shard and master (0): the masters are the same values, but the shards round
# ties away from zero where 0 rounds them to even, so the two runs part in
# the last bits from the first master that lies at a tie. split_close checks
# they stay within 1e-4 of each tensor's largest value, masters and moments
# (a master that lost its low half would be 1e-3 off or more after a step),
# and that at most 1% of the bf16 values differ, by one unit in the last place.
# st_tensors.tensors(PATH): a safetensors file's F32 and BF16 tensors as numpy
# arrays (BF16 as raw uint16), for the comparisons below.
cat >"$TMP/st_tensors.py" <<'PY'
import json, struct
import numpy as np
def tensors(path):
    d = open(path, "rb").read()
    n = struct.unpack("<Q", d[:8])[0]
    h = json.loads(d[8:8 + n])
    return {k: np.frombuffer(d[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]],
                             dtype=np.float32 if v["dtype"] == "F32" else np.uint16)
            for k, v in h.items() if k != "__metadata__"}
PY

split_close() {
    local g=$1 n=$2
    shift 2
    ec $((g * n)) -g $g -n $n --timeout 60 -- $EC --dtype bf16 --ckpt-dir $PWD/keep --ckpt-at 12 "$@" &&
        mv out out.keep &&
        ec $((g * n)) -g $g -n $n --timeout 60 -- $EC --dtype bf16 --ckpt-dir $PWD/split --ckpt-at 12 \
            --master-split "$@" || return 1
    grep -q "^0: ok memory (.*): optim bytes [0-9]* (peak [0-9]*) = 2.5 (moments, the masters. low halves)" out &&
        grep -q "^0: ok split master (.*): a checkpoint load without the optimizer that holds the masters. low halves is refused and changes nothing" out &&
        grep -q "^0: ok split master (.*): after bmt_optim_destroy the blocks keep their values, bitwise" out &&
        grep -q "^0: ok ckpt (.*): from the step-12 checkpoint, steps 13..20 again: losses and parameters bitwise" out &&
        PYTHONPATH=$TMP /usr/bin/python3 - keep/ec split/ec <<'PY'
import glob, os, sys
import numpy as np
from st_tensors import tensors
worst, bf_diff, bf_total, bf_far, seen = 0.0, 0, 0, 0, 0
for f in sorted(glob.glob(sys.argv[1] + "/*.safetensors")):
    a, b = tensors(f), tensors(os.path.join(sys.argv[2], os.path.basename(f)))
    assert a.keys() == b.keys(), f
    for k in a:
        x, y = a[k], b[k]
        seen += 1
        if x.dtype == np.uint16:
            bf_total += x.size
            bf_diff += int(np.sum(x != y))
            bf_far += int(np.sum(np.abs(x.astype(np.int64) - y.astype(np.int64)) > 1))
        else:
            worst = max(worst, float(np.max(np.abs(x - y)) / max(float(np.max(np.abs(x))), 1e-30)))
print("split against keep: %d tensors, masters and moments within %.2g of their largest value, "
      "%d of %d bf16 values differ, %d by more than one unit" % (seen, worst, bf_diff, bf_total, bf_far))
sys.exit(0 if seen > 40 and worst < 1e-4 and bf_diff <= bf_total // 100 and bf_far == 0 else 1)
PY
}

for v in "2x2:" "1x1:" "4x1:--zero 2 --ckpt 0"; do
    layout=${v%%:*} extra=${v#*:}
    g=${layout%x*} n=${layout#*x}
    test_expect_success "split master (bf16, ${g}x${n}${extra:+, }${extra}): the reference, 2.5 shards of state, rewind bitwise; within 1e-4 of keeping shard and master" "
        split_close $g $n $extra
    "
done
# engine_check's rewind on one rank first loads a copy of the checkpoint with
# a byte of its last file flipped: the load fails on that file's checksum
# after every other block is loaded, and the optimizer must then refuse to
# step (under the split a half-loaded pair of halves may even join to NaN)
# until the good load, whose steps 13..20 are then the first run's.
test_expect_success "a checkpoint load that fails half-way leaves the optimizer refusing to step until a load succeeds (1x1: f32, bf16 split)" '
    for a in f32 "bf16 --master-split"; do
        ec 1 -g 1 -n 1 --timeout 60 -- $EC --ckpt-dir "$PWD/hw-${a%% *}" --ckpt-at 12 --dtype $a &&
        grep -q "^0: ok ckpt (.*): a load that fails half-way (.*head.optim.safetensors.*checksum.*) leaves the optimizer refusing to step: .*a checkpoint load failed half-way" out &&
        grep -q "^0: ok ckpt (.*): from the step-12 checkpoint, steps 13..20 again: losses and parameters bitwise" out || exit 1
    done
'

# Checkpoints across the modes: each run's step-12 checkpoint (keep/, split/)
# loaded by an optimizer of the other mode and
# saved again (engine_check --resave-from). The masters and moments are the
# same bits both ways (the split holds the master exactly); a bf16 value may
# differ only where its master lies exactly at a tie (low 16 bits 0x8000),
# which the split rounds away from zero and keeping shard and master to even.
test_expect_success "split master: checkpoints load across master_only 0 and 2 and save back the same masters and moments, bit for bit" '
    ec 4 -g 2 -n 2 --timeout 60 -- $EC --dtype bf16 --ckpt-dir $PWD/keep --ckpt-at 12 &&
    ec 4 -g 2 -n 2 --timeout 60 -- $EC --dtype bf16 --ckpt-dir $PWD/split --ckpt-at 12 --master-split &&
    ec 4 -g 2 -n 2 --timeout 60 -- $EC --dtype bf16 --ckpt-dir $PWD/s2 --ckpt-at 12 --master-split --resave-from $PWD/keep/ec &&
    ec 4 -g 2 -n 2 --timeout 60 -- $EC --dtype bf16 --ckpt-dir $PWD/k2 --ckpt-at 12 --resave-from $PWD/split/ec &&
    PYTHONPATH=$TMP /usr/bin/python3 - keep/ec s2-resaved/ec split/ec k2-resaved/ec <<-\PY
	import glob, os, sys
	import numpy as np
	from st_tensors import tensors
	bad = 0
	for src, dst in ((sys.argv[1], sys.argv[2]), (sys.argv[3], sys.argv[4])):
	    files = sorted(glob.glob(src + "/*.safetensors"))
	    assert len(files) == 12, files
	    for f in files:
	        a, b = tensors(f), tensors(os.path.join(dst, os.path.basename(f)))
	        assert a.keys() == b.keys(), f
	        for k in a:
	            if a[k].dtype == np.float32:
	                bad += int(np.sum(a[k].view(np.uint32) != b[k].view(np.uint32)))
	                continue
	            o = tensors(f.replace(".safetensors", ".optim.safetensors"))
	            tie = (o[k + ".master"].view(np.uint32) & 0xffff) == 0x8000
	            bad += int(np.sum((a[k] != b[k]) & ~tie))
	print("across the modes: %d values differ where they may not" % bad)
	sys.exit(0 if bad == 0 else 1)
	PY
'

# Checkpoints (bmt/ckpt.h) inside the engine: save after step 12, rewind to it
# at the end, train 13..20 again: bitwise the same (f32 and bf16 with its f32
# master weights, both zero levels).
for v in "2x2:" "2x2:--dtype bf16" "1x4:--zero 2 --ckpt 0" "4x1:--dtype bf16"; do
    layout=${v%%:*} extra=${v#*:}
    g=${layout%x*} n=${layout#*x}
    test_expect_success "checkpoint rewind ${g}x${n} ${extra:-f32}: steps 13..20 again from the step-12 checkpoint, bitwise" "
        ec $((g * n)) -g $g -n $n --timeout 60 -- \$EC --ckpt-dir \$PWD/ck --ckpt-at 12 $extra &&
        grep -q '^0: ok ckpt (.*): loading the step-12 checkpoint changed the trained parameters' out &&
        grep -q '^0: ok ckpt (.*): from the step-12 checkpoint, steps 13..20 again: losses and parameters bitwise' out &&
        test -f ck/ec/train_state.json && test \$(cat ck/latest) = ec
    "
done

# Promises of docs/runtime.md, docs/engine.md and the headers that no other
# program checks (tests/progs/api_promises.c). With BMT_BACKEND=none a split of
# a communicator holding every rank in another order than the world's took
# the (color, key) pairs PMIx gathers in world-rank order for the parent's
# order: wrong members and order, and exit 0.
for layout in 1x1 1x3 2x2; do
    g=${layout%x*} n=${layout#*x}
    test_expect_success "documented API promises ${g}x${n} (shm): splits, argument errors, refusals after a run (api_promises)" "
        with_timeout 60 \"\$BMLAUNCH\" --metrics-port 0 -g $g -n $n -- \"\$PROGS/api_promises\" >out 2>err ||
            { cat out err; false; } &&
        test \$(grep -c '^[0-9]*: api_promises: 12 passed, 0 failed\$' out) -eq $((g * n))
    "
done

test_expect_success "BMT_BACKEND=none: a split of a reordered world has the members and order of (key, parent rank)" '
    with_timeout 60 "$BMLAUNCH" --metrics-port 0 --backend none -g 1 -n 3 -- "$PROGS/api_promises" none >out 2>err ||
        { cat out err; false; } &&
    test $(grep -c "^[0-9]: api_promises: 2 passed, 0 failed\$" out) -eq 3 &&
    with_timeout 60 "$BMLAUNCH" --metrics-port 0 --backend none -g 2 -n 2 -- "$PROGS/api_promises" none >out 2>err ||
        { cat out err; false; } &&
    test $(grep -c "^[0-9]: api_promises: 2 passed, 0 failed\$" out) -eq 4
'

test_done
