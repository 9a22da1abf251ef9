#!/bin/bash
# The GPU benchmarks' analysis tools on this machine: bench/gpu/timeline.py
# (what a step's GPU time is made of, from bench/gpu/trace.c's CUPTI records)
# on a made-up trace whose every figure is known, and its refusals; trace.c
# builds where CUDA's CUPTI is installed.
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3
TL=$SRC/bench/gpu/timeline.py

# Times in ns. Step 0 runs from the first encoder_fwd (1 ms) to the second
# (10 ms): 9 ms. Compute stream 13: encoder 1-2 ms, gemm 2.1-5 (queued at
# 1.5: before the encoder ended), ln 9-9.5 (queued at 8.8: the host was late
# by 3.8 ms of the 4 ms gap), a memset 9.6-9.7 (no queued time); busy 4.5 ms,
# idle 4.5 (3 gaps: 0.1, 4 and 0.1 ms, and the 0.3 ms before the next step).
# Stream 15: adamw 2.5-4 (beside the gemm) and 6-8 (inside the 4 ms gap):
# busy 3.5 ms, 1.5 of it beside compute, 2 of the idle time.
cat >"$TMP/t.tsv" <<'TSV'
K	1000000	2000000	900000	13	1,1,1	encoder_fwd
K	2100000	5000000	1500000	13	2,66,1	gemm
K	2500000	4000000	2400000	15	8192,1,1	adamw
K	6000000	8000000	5900000	15	8192,1,1	adamw
K	9000000	9500000	8800000	13	1024,1,1	ln
S	9600000	9700000	0	13	4	memset
K	10000000	11000000	9900000	13	1,1,1	encoder_fwd
K	11100000	12000000	11000000	13	2,66,1	gemm
K	20000000	21000000	19000000	13	1,1,1	encoder_fwd
TSV

test_expect_success "timeline.py: a step's length, busy and idle time, what the host delayed, what ran beside" '
    $PY "$TL" "$TMP/t.tsv" 0 >out && cat out &&
    grep -q "^step 0: 9.00 ms; compute stream 13: busy 4.50 ms (50.0%), idle 4.50 ms in 3 gaps$" out &&
    grep -q "^  of the idle time, 3.80 ms with the next kernel not yet enqueued by the host$" out &&
    grep -q "^  of the idle time, 2.00 ms with other streams. work running" out &&
    grep -q "^  stream  15: busy     3.50 ms,     1.50 ms of it beside the compute stream.s kernels, 2 records$" out &&
    grep -q "^     2.900 ms  32.2%     1 x  gemm$" out &&
    grep -q "4000.0 us after gemm, before ln (host late); beside: 1 x adamw" out
'

test_expect_success "timeline.py: the default step is the second last complete one" '
    $PY "$TL" "$TMP/t.tsv" >out &&
    grep -q "^step 1: 10.00 ms; compute stream 13: busy 1.90 ms" out
'

test_expect_success "timeline.py refuses a step that is not there, a file that is not a trace, a trace without two steps" '
    test_must_fail $PY "$TL" "$TMP/t.tsv" 2 2>err && grep -q "STEP must be 0..1" err &&
    test_must_fail $PY "$TL" "$TMP/t.tsv" x 2>err && grep -q "STEP must be 0..1" err &&
    echo "hello" >bad.tsv &&
    test_must_fail $PY "$TL" bad.tsv 2>err && grep -q "bad.tsv line 1 is not a bench/gpu/trace.c record" err &&
    head -3 "$TMP/t.tsv" >one.tsv &&
    test_must_fail $PY "$TL" one.tsv 2>err && grep -q "want two launches of encoder_fwd" err &&
    test_must_fail $PY "$TL" missing.tsv 2>err && grep -q "No such file" err
'

# tests/run's NAME words, on made-up unit tests in a BUILDDIR of their own.
mkdir -p "$TMP/fake/tests/unit"
for n in test_aa test_aa_ops test_bb; do
    printf '#!/bin/sh\necho "1..1"\necho "ok 1 - %s ran"\n' "$n" >"$TMP/fake/tests/unit/$n"
    chmod +x "$TMP/fake/tests/unit/$n"
done
test_expect_success "tests/run: a whole test name runs that test only, a part of one every test it is in" '
    BUILDDIR="$TMP/fake" "$SRC/tests/run" unit test_aa >out && cat out &&
    grep -q "^unit/test_aa  *1 passed" out && ! grep -q test_aa_ops out && ! grep -q test_bb out &&
    grep -q "^1 passed, 0 failed$" out &&
    BUILDDIR="$TMP/fake" "$SRC/tests/run" unit aa >out &&
    grep -q "^unit/test_aa  *1" out && grep -q "^unit/test_aa_ops  *1" out && ! grep -q test_bb out &&
    BUILDDIR="$TMP/fake" "$SRC/tests/run" unit test_bb test_aa_ops >out &&
    grep -q "^2 passed, 0 failed$" out && ! grep -q "^unit/test_aa " out
'

# bench/gpu/step_stats.py, the A/B scripts' reading of a trainer's log.
test_expect_success "step_stats.py: the median step time after the warm-up, the last loss, the peak in GiB" '
    for s in 1 2 3 4 5 6; do
        printf "0: step   %d/6 | loss %d.5 | lr 1.00e-03 | norm 1.0 | %d.0 ms | 3K tok/s | MFU - | mem 10.0 MiB (peak %d.0)\n" \
            $s $((7 - s)) $((s * 10)) $((s * 512))
    done >run.log &&
    test "$($PY "$SRC/bench/gpu/step_stats.py" run.log)" = "50.00 1.5 3.00" &&
    head -3 run.log >short.log &&
    test "$($PY "$SRC/bench/gpu/step_stats.py" short.log)" = "- - -"
'

test_expect_success "bench/gpu/master_ab.sh refuses bad settings before building anything" '
    MAB="$SRC/bench/gpu/master_ab.sh" &&
    (cd "$TMP" && test_must_fail env MODES="1 3" OUT="$TMP/mab" bash "$MAB" 2>err) &&
    grep -q "MODES holds --master-only values 0, 1 or 2, not .3." "$TMP/err" &&
    (cd "$TMP" && test_must_fail env RUNS="bert:x:1:0" OUT="$TMP/mab" bash "$MAB" 2>err) &&
    grep -q "the trainer is gpt2 or llama" "$TMP/err" &&
    (cd "$TMP" && test_must_fail env STEPS=2 OUT="$TMP/mab" bash "$MAB" 2>err) &&
    grep -q "STEPS must be a whole number >= 4" "$TMP/err" && test ! -e "$TMP/mab"
'

if [ -f /usr/local/cuda/include/cupti.h ]; then
    test_expect_success "bench/gpu/trace.c builds (CUPTI) into a library with the driver entry point" '
        make -s -C "$SRC" BUILDDIR="$TMP/b" "$TMP/b/bench/libbmt_trace.so" &&
        nm -D "$TMP/b/bench/libbmt_trace.so" | grep -q " T InitializeInjection$"
    '
fi
if [ -x /usr/local/cuda/bin/nvcc ]; then
    make -s -C "$SRC" BUILDDIR="$TMP/b" "$TMP/b/bench/side_update" >/dev/null 2>&1
    test_expect_success "bench/gpu/side_update.cu builds and refuses bad arguments before touching a device" '
        SU="$TMP/b/bench/side_update" && test -x "$SU" &&
        { "$SU" bogus 2>err; test $? = 2; } && grep -q "the model is d48 or 1b, not .bogus." err &&
        { "$SU" d48 0 2>err; test $? = 2; } && grep -q "LAYERS is a whole number from 1 to 256, not .0." err &&
        { "$SU" 1b 12x 2>err; test $? = 2; } && grep -q "not .12x." err &&
        { "$SU" d48 8 sideways 2>err; test $? = 2; } && grep -q "is ldg, tma or tma2, not .sideways." err &&
        { "$SU" d48 8 tma extra 2>err; test $? = 2; } && grep -q "at most three arguments" err &&
        grep -q "^usage: side_update" err
    '
fi
test_done
