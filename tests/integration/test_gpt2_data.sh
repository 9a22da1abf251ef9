#!/bin/bash
# The GPT-2 example's data against llm.c: shards written by numpy exactly as
# llm.c's dev/data/data_common.py write_datafile writes them read back through
# data_loader_* batch for batch as llm.c's DataLoader (llmc/dataloader.h, no
# shuffling, transcribed below) serves them, on every rank of several worlds
# through shard switches and epochs; data_write_shard's bytes equal
# write_datafile's; the shipped corpus tokenizes into the shards write_datafile
# makes of its bytes and decodes back to itself; and inputs that must not pass
# silently: a cut or short shard, a folder the pattern cannot list, --resume on
# shards that moved the saved position, a --val shard --data also matches,
# ranks whose --data or --val matches other shards than rank 0's.
# Driver: tests/progs/gpt2_data_check.c.
. "$(dirname "$0")/lib.sh"

CHECK=$PROGS/gpt2_data_check
CORPUS=$SRC/examples/gpt2/data/corpus.txt
# Debian's python3 (with python3-numpy, scripts/deps.sh), not one first on PATH.
PY=/usr/bin/python3
export CHECK CORPUS PY

# write_datafile of llm.c dev/data/data_common.py, models "gpt-2" and
# "llama-3", as a module.
cat >"$TMP/llmc.py" <<'EOF'
import numpy as np

HEADERS_INFO = {
    "gpt-2": {"magic": 20240520, "version": 1, "token_dtype": np.uint16},
    "llama-3": {"magic": 20240801, "version": 7, "token_dtype": np.uint32},
}

def write_datafile(filename, toks, model_desc="gpt-2"):
    assert len(toks) < 2**31, "token count too large"
    info = HEADERS_INFO[model_desc]
    header = np.zeros(256, dtype=np.int32)
    header[0] = info["magic"]
    header[1] = info["version"]
    header[2] = len(toks)
    toks_np = np.array(toks, dtype=info["token_dtype"])
    with open(filename, "wb") as f:
        f.write(header.tobytes())
        f.write(toks_np.tobytes())

class DataLoader:
    """llmc/dataloader.h DataLoader with should_shuffle = 0, statement for statement."""
    def __init__(self, files, B, T, process_rank, num_processes):
        self.files = sorted(files)  # glob(3) sorts its matches
        self.B, self.T = B, T
        self.num_processes, self.process_rank = num_processes, process_rank
        for i in range(len(self.files)):
            assert self.load_shard_(i) >= num_processes * B * T + 1
        self.reset()

    def load_shard_(self, i):
        self.data = open(self.files[i], "rb").read()
        header = np.frombuffer(self.data[:1024], dtype="<i4")
        assert (header[0], header[1]) in ((20240520, 1), (20240801, 7))
        self.w = 2 if header[0] == 20240520 else 4  # bytes per token
        ntok = int(header[2])
        assert len(self.data) == 1024 + self.w * ntok
        self.total_batch_size_bytes = self.num_processes * self.B * self.T * self.w
        self.local_batch_offset_bytes = self.process_rank * self.B * self.T * self.w
        self.shard_num_samples = (ntok * self.w - self.w) // self.total_batch_size_bytes
        return ntok

    def reset(self):
        self.current_shard_idx = 0
        self.current_sample_idx = 0
        self.load_shard_(0)

    def advance_(self):
        if self.current_shard_idx == len(self.files) - 1:
            self.reset()
            return
        self.current_shard_idx = (self.current_shard_idx + 1) % len(self.files)
        self.current_sample_idx = 0
        self.load_shard_(self.current_shard_idx)

    def next_batch(self):
        if self.current_sample_idx >= self.shard_num_samples:
            self.advance_()
        x, y = self.load_batch()
        self.current_sample_idx += 1
        return x, y

    def load_batch(self):
        assert self.current_sample_idx < self.shard_num_samples
        off = 1024 + self.current_sample_idx * self.total_batch_size_bytes + self.local_batch_offset_bytes
        n = self.B * self.T
        buf = np.frombuffer(self.data[off:off + self.w * (n + 1)],
                            dtype="<u2" if self.w == 2 else "<u4").astype(np.int64)
        assert len(buf) == n + 1
        return buf[:n], buf[1:]
EOF
export PYTHONPATH=$TMP

# compare_reads "B T WORLD STEPS"...: on every rank of each world, gpt2_data_check
# reads the shards d/s_*.bin batch by batch exactly as the llmc DataLoader above
# serves them (the position after each step, from llm.c's resume state).
compare_reads() {
    for cfg in "$@"; do
        set -- $cfg
        local B=$1 T=$2 W=$3 S=$4 r
        for r in $(seq 0 $((W - 1))); do
            "$CHECK" read "d/s_*.bin" $B $T $r $W $S >ours || return 1
            $PY - $B $T $r $W $S >want <<-EOF || return 1
			import sys, glob, llmc
			B, T, r, W, S = map(int, sys.argv[1:])
			dl = llmc.DataLoader(glob.glob("d/s_*.bin"), B, T, r, W)
			G = W * B * T
			for _ in range(S):
			    x, y = dl.next_batch()
			    print("%d %d | %s | %s" % (dl.current_shard_idx, dl.current_sample_idx * G,
			          " ".join(map(str, x)), " ".join(map(str, y))))
			EOF
            cmp want ours || { echo "B=$B T=$T rank $r of $W differs:"; diff want ours | head -5; return 1; }
        done
    done
}
export -f compare_reads

test_expect_success "numpy and the driver are there" '
    test -x "$CHECK" && $PY -c "import numpy"
'

test_expect_success "data_write_shard writes the bytes of llm.c write_datafile (cmp), sizes 0 to 100000" '
    $PY - <<-EOF
	import numpy as np, llmc
	rng = np.random.default_rng(7)
	for n in (0, 1, 31, 1000, 100000):
	    t = rng.integers(0, 65536, n, dtype=np.uint16)
	    t[:min(n, 2)] = [65535, 0][:min(n, 2)]
	    t.astype("<u2").tofile("raw_%d" % n)
	    llmc.write_datafile("numpy_%d.bin" % n, t.tolist())
	EOF
    for n in 0 1 31 1000 100000; do
        "$CHECK" write ours_$n.bin raw_$n && cmp numpy_$n.bin ours_$n.bin || exit 1
    done
    test "$(stat -c %s ours_100000.bin)" -eq 201024
'

# Shards of 1000, 61 (= 2*30 + 1) and 3000 tokens, random uint16 values;
# steps enough for three epochs of the smallest world.
test_expect_success "shards written by numpy read as llm.c DataLoader serves them: every rank of 5 worlds, 3 epochs" '
    mkdir d &&
    $PY - <<-EOF
	import numpy as np, llmc
	rng = np.random.default_rng(11)
	for name, n in (("d/s_b.bin", 61), ("d/s_a.bin", 1000), ("d/s_c.bin", 3000)):
	    llmc.write_datafile(name, rng.integers(0, 65536, n, dtype=np.uint16).tolist())
	EOF
    compare_reads "2 5 3 250" "1 30 2 300" "4 8 1 60" "1 1 4 3000" "3 7 2 200" &&
    test "$(cut -d" " -f1 ours | sort -u | tr "\n" " ")" = "0 1 2 "
'

test_expect_success "data_write_shard_u32 writes the bytes of write_datafile(model_desc=\"llama-3\") (cmp)" '
    $PY - <<-EOF
	import numpy as np, llmc
	rng = np.random.default_rng(5)
	for n in (0, 1, 1000, 70000):
	    t = rng.integers(0, 128256, n, dtype=np.uint32)
	    t[:min(n, 2)] = [2**31 - 1, 65536][:min(n, 2)]
	    t.astype("<u4").tofile("raw_%d" % n)
	    llmc.write_datafile("numpy_%d.bin" % n, t.tolist(), "llama-3")
	EOF
    for n in 0 1 1000 70000; do
        "$CHECK" write32 ours_$n.bin raw_$n && cmp numpy_$n.bin ours_$n.bin || exit 1
    done
    test "$(stat -c %s ours_70000.bin)" -eq $((1024 + 4 * 70000))
'

test_expect_success "llama-3 shards (ids past 65,535) beside gpt-2 ones read as the DataLoader serves them" '
    mkdir d &&
    $PY - <<-EOF
	import numpy as np, llmc
	rng = np.random.default_rng(13)
	llmc.write_datafile("d/s_a.bin", rng.integers(0, 128256, 500, dtype=np.uint32).tolist(), "llama-3")
	llmc.write_datafile("d/s_b.bin", rng.integers(0, 65536, 300, dtype=np.uint16).tolist())
	llmc.write_datafile("d/s_c.bin", rng.integers(65536, 2**31, 400, dtype=np.uint32).tolist(), "llama-3")
	EOF
    compare_reads "2 5 3 40" "1 7 2 60" &&
    test "$(cut -d" " -f1 ours | sort -u | tr "\n" " ")" = "0 1 2 " &&
    awk -F"|" "{ print \$2 }" ours | tr " " "\n" | awk "\$1 > 65535 { big = 1 } END { exit !big }"
'

test_expect_success "a 4-byte token of 2^31 or more is refused, naming the shard and the token" '
    $PY - <<-EOF
	import numpy as np, llmc
	t = list(range(100))
	t[37] = 2**31
	llmc.write_datafile("big.bin", t, "llama-3")
	EOF
    test_must_fail "$CHECK" read big.bin 1 50 0 1 2 >out 2>err &&
    grep -q "big.bin: token 37 of the shard is 2147483648, past the int32 ids a batch holds" err &&
    test ! -s out
'

test_expect_success "tokenizing the corpus gives write_datafile of its bytes, split at floor(0.1 n)" '
    "$CHECK" tokenize "$CORPUS" corpus 0.1 &&
    $PY - "$CORPUS" <<-EOF
	import sys, llmc
	text = open(sys.argv[1], "rb").read()
	nv = int(0.1 * len(text))
	llmc.write_datafile("want_train.bin", list(text[:len(text) - nv]))
	llmc.write_datafile("want_val.bin", list(text[len(text) - nv:]))
	print(len(text), nv)
	EOF
    cmp want_train.bin corpus_train.bin && cmp want_val.bin corpus_val.bin &&
    test "$(stat -c %s corpus_train.bin)" -eq $((1024 + 2 * 344843)) &&
    test "$(ls | grep -c tmp)" -eq 0
'

test_expect_success "decode(train) + decode(val) of the corpus is the corpus" '
    "$CHECK" tokenize "$CORPUS" c 0.1 &&
    { "$CHECK" decode c_train.bin && "$CHECK" decode c_val.bin; } >back.txt &&
    cmp "$CORPUS" back.txt
'

# World 2, B=4, T=64: a global batch is 512 tokens, so step 3 of rank 1 reads
# bytes [2*512 + 256, ... + 257) of the text and leaves the position at 1536.
test_expect_success "the corpus reads as a dataset: step 3 of rank 1 of 2 is bytes 1280..1536 of the text" '
    "$CHECK" tokenize "$CORPUS" c 0.1 &&
    "$CHECK" read c_train.bin 4 64 1 2 3 >b &&
    test "$(wc -l <b)" -eq 3 &&
    test "$(sed -n 3p b | cut -d"|" -f1 | xargs)" = "0 1536" &&
    test "$(sed -n 3p b | cut -d"|" -f2 | xargs)" = "$(tail -c +1281 "$CORPUS" | head -c 256 | od -An -v -tu1 | xargs)" &&
    test "$(sed -n 3p b | cut -d"|" -f3 | xargs)" = "$(tail -c +1282 "$CORPUS" | head -c 256 | od -An -v -tu1 | xargs)"
'

test_expect_success "the corpus is 100 KB to 1 MB of ASCII text and its sha256 is the one its README records" '
    size=$(stat -c %s "$CORPUS") && test "$size" -ge 100000 && test "$size" -le 1000000 &&
    ! LC_ALL=C grep -q -P "[^\x09\x0a\x20-\x7e]" "$CORPUS" &&
    sum=$(sha256sum "$CORPUS" | cut -d" " -f1) &&
    grep -q "sha256  $sum  corpus.txt" "$SRC/examples/gpt2/data/README.md"
'

test_expect_code 1 "a shard cut by one byte is refused at open, naming the file" '
    $PY -c "import llmc; llmc.write_datafile(\"cut.bin\", list(range(100)))" &&
    truncate -s -1 cut.bin &&
    { "$CHECK" read cut.bin 1 8 0 1 1 2>err; rc=$?; } &&
    grep -q "cut.bin: the header.s 100 tokens of 2 bytes need 1224 bytes but the file has 1223 (count larger than the file: truncated" err || exit 3
    exit $rc
'

test_expect_code 1 "a shard too short for one global batch is refused, naming the file" '
    $PY -c "import llmc; llmc.write_datafile(\"small.bin\", list(range(64)))" &&
    { "$CHECK" read small.bin 2 16 0 2 1 2>err; rc=$?; } &&
    grep -q "small.bin: 64 tokens, fewer than one global batch needs: world\*B\*T+1 = 2\*2\*16+1 = 65" err || exit 3
    exit $rc
'

# glob(3) on its own skips a folder it cannot list, and the shards in it: the
# run would train on part of its data and exit 0. Permissions do not stop
# root, so as root the reader runs as nobody (setpriv).
test_expect_code 1 "a folder the pattern cannot list is refused, naming it, not skipped with its shards" '
    mkdir -p d/a d/b &&
    $PY -c "import llmc; [llmc.write_datafile(\"d/%s/s.bin\" % x, list(range(100))) for x in \"ab\"]" &&
    chmod 0311 d/b &&
    as= &&
    if [ "$(id -u)" = 0 ]; then
        chmod a+x "$TMP" && as="setpriv --reuid=65534 --regid=65534 --clear-groups"
    fi &&
    { $as "$CHECK" read "d/*/*.bin" 1 8 0 1 30 >out 2>err; rc=$?; } &&
    grep -q "d/\*/\*.bin: cannot list the folder d/b: Permission denied; its shards would be left out" err &&
    test ! -s out &&
    { $as "$CHECK" read "d/b/*.bin" 1 8 0 1 1 2>err2; rc2=$?; } && test $rc2 -eq 1 &&
    grep -q "d/b/\*.bin: cannot list the folder d/b: Permission denied" err2 || exit 3
    exit $rc
'

# A shard writer killed between its last write and its rename leaves a whole
# shard under a temporary name; "DIR/*" would train on its tokens twice. The
# writer's temporaries now start with a dot (glob leaves them out), and one a
# pattern matches (an earlier writer's, or a pattern naming dot files) is
# refused.
test_expect_code 1 "a shard writer's leftover temporary file is refused, naming it; one with a leading dot is not matched by *" '
    mkdir t &&
    $PY -c "import llmc; [llmc.write_datafile(n, list(range(100))) for n in (\"t/s.bin\", \"t/s.bin.tmp.123.0\", \"t/.s.bin.tmp.123.1\")]" &&
    { "$CHECK" read "t/*" 1 8 0 1 1 >out 2>err; rc=$?; } &&
    grep -q "t/s.bin.tmp.123.0: a shard writer.s temporary file (NAME.tmp.PID.N), left by a writer that did not finish; its tokens may be a shard.s a second time. Remove it, or give a pattern that does not match it" err &&
    test ! -s out && rm t/s.bin.tmp.123.0 &&
    "$CHECK" read "t/*" 1 8 0 1 1 >out 2>err && test -s out &&
    { "$CHECK" read "t/.*.tmp.*" 1 8 0 1 1 2>err; rc2=$?; } && test $rc2 -eq 1 &&
    grep -q "t/.s.bin.tmp.123.1: a shard writer.s temporary file" err || exit 3
    exit $rc
'

# A checkpoint's data position is a shard index and a token offset. Shards of
# 100 tokens, B 2 T 16: 3 batches a shard, so after 4 steps the position is
# token 32 of shard 1 (s_c.bin). A shard sorted in before it (of the same size,
# as llm.c's shards are) would move the position onto other tokens.
test_expect_success "--resume refuses --data whose shard at the saved position is another or remade; the same shards moved or one appended resume" '
    $PY - <<-EOF
	import llmc
	for i, name in enumerate(("s_b", "s_c", "s_a", "s_d")):
	    llmc.write_datafile(name + ".bin", [(7 * i + k) % 256 for k in range(100)])
	EOF
    mkdir d moved && mv s_b.bin s_c.bin d/ &&
    run="$BUILDDIR/bin/gpt2 -b 2 -t 16 --steps 6" &&
    $run --data "d/s_*.bin" --steps 4 --save-dir ck >out 2>&1 &&
    $PY -c "import json, xxhash; d = json.load(open(\"ck/step-00000004/train_state.json\"))[\"user\"][\"data\"]
h = xxhash.xxh3_64_hexdigest(open(\"d/s_c.bin\", \"rb\").read()[1024:])
assert d == {\"shard\": 1, \"pos\": 32, \"name\": \"s_c.bin\", \"tokens\": 100, \"hashed\": [0, 100], \"xxh3\": h}, d" &&
    cp -r ck ck_moved && cp -r ck ck_more && cp d/s_*.bin moved/ &&
    $run --data "moved/s_*.bin" --save-dir ck_moved --resume >out 2>&1 &&
    grep -q "resumed from ck_moved/step-00000004 (step 4)" out && grep -q "step   6/6" out &&
    cp s_d.bin d/ &&
    $run --data "d/s_*.bin" --save-dir ck_more --resume >out 2>&1 &&
    grep -q "resumed from ck_more/step-00000004 (step 4)" out &&
    mv s_a.bin d/ &&
    exits 1 $run --data "d/s_*.bin" --save-dir ck --resume &&
    grep -q "gpt2: rank 0: --data d/s_\*.bin is not the data the checkpoint was trained on: its position is token 32 of shard 1, s_c.bin of 100 tokens, and shard 1 of --data is now d/s_b.bin of 100 tokens. Resume with the shards it was trained on, in the same order, or start a new run from its weights (--init-from ck/step-00000004)" err &&
    rm d/s_a.bin d/s_d.bin &&
    $PY -c "import llmc; llmc.write_datafile(\"d/s_c.bin\", list(range(120)))" &&
    exits 1 $run --data "d/s_*.bin" --save-dir ck --resume &&
    grep -q "now d/s_c.bin of 120 tokens" err &&
    rm d/s_c.bin &&
    exits 1 $run --data "d/s_*.bin" --save-dir ck --resume &&
    grep -q "shard 1 of --data is now no such shard (it matches 1)" err &&
    test "$(cat ck/latest)" = step-00000004 && test ! -e ck/step-00000005
'

# The same name and token count do not make the same tokens: a shard remade
# at the same size (another tokenizer, another order) would put the saved
# position onto other tokens. The checkpoint keeps the XXH3 of the tokens
# around the position (2^18 each side; shards of 600,000 tokens here, so the
# range is a window, not the whole shard); the window is checked, the rest of
# the shard is not.
test_expect_success "--resume refuses a shard remade at the same name and size; one changed outside the hashed window resumes" '
    $PY - <<-EOF
	import llmc
	llmc.write_datafile("w.bin", [k % 50000 for k in range(600000)])
	EOF
    run="$BUILDDIR/bin/gpt2 -b 2 -t 16 --steps 3" &&
    $run --data w.bin --steps 2 --save-dir ck >out 2>&1 &&
    $PY -c "import json, xxhash; d = json.load(open(\"ck/step-00000002/train_state.json\"))[\"user\"][\"data\"]
b = open(\"w.bin\", \"rb\").read()[1024:]
assert d[\"pos\"] == 64 and d[\"hashed\"] == [0, 64 + 2**18], d
assert d[\"xxh3\"] == xxhash.xxh3_64_hexdigest(b[:2 * (64 + 2**18)]), d" &&
    cp -r ck ck_far && cp w.bin w.orig &&
    $PY - <<-EOF &&
	import llmc
	llmc.write_datafile("w.bin", [(k * 7 + 3) % 50000 for k in range(600000)])
	EOF
    exits 1 $run --data w.bin --save-dir ck --resume &&
    grep -q "gpt2: rank 0: --data w.bin is not the data the checkpoint was trained on: its position is token 64 of shard 0, w.bin of 600000 tokens, and shard 0 of --data is now w.bin, of that name and size, but other tokens: XXH3 [0-9a-f]\{16\} of tokens 0..262208, where the checkpoint recorded [0-9a-f]\{16\}. Resume with the shards it was trained on" err &&
    test "$(cat ck/latest)" = step-00000002 && test ! -e ck/step-00000003 &&
    $PY - <<-EOF &&
	import llmc
	llmc.write_datafile("w.bin", [k % 50000 if k < 500000 else 1 for k in range(600000)])
	EOF
    $run --data w.bin --save-dir ck_far --resume >out 2>&1 &&
    grep -q "resumed from ck_far/step-00000002 (step 2)" out && grep -q "step   3/3" out
'

# --data "corpus_*.bin" matches corpus_val.bin too: the run would train on its
# validation shard and report a validation loss on trained tokens.
test_expect_success "a --val shard that --data matches too (by its path or a hard link) is refused before any step" '
    "$CHECK" tokenize "$CORPUS" c 0.1 && ln c_val.bin linked.bin &&
    run="$BUILDDIR/bin/gpt2 -b 2 -t 16 --steps 2" &&
    exits 1 $run --data "c_*.bin" --val c_val.bin &&
    grep -q "gpt2: rank 0: --val shard c_val.bin is also a training shard: --data c_\*.bin matches it (as c_val.bin), so the validation loss would be measured on tokens the model trains on; give --data a path or pattern that leaves the validation shards out" err &&
    ! grep -q "^step" stdout &&
    exits 1 $run --data "linked.bin" --val "$PWD/c_val.bin" &&
    grep -q "(as linked.bin)" err &&
    $run --data "c_train.bin" --val c_val.bin >out 2>&1 && grep -q "val loss" out
'

# Each rank reads its part of a global batch at a position the ranks move in
# step, so all must see the same shards. Node-local copies of the data that
# differ (a shard missing on one node, one of another size) would have each
# rank switch shards at its own moment: tokens trained twice, others never,
# exit 0; a --val that differs runs another number of batches on each rank
# and hangs them. Here each rank runs in a folder of its own (n0/, n1/), as
# on nodes with their own disks.
test_expect_success "ranks that see other shards under the same --data or --val are refused before any step, naming both; the same shards in each rank's folder train" '
    $PY - <<-EOF &&
	import os, llmc
	for d in ("n0", "n1", "same0", "same1"):
	    os.mkdir(d)
	a, b = [k % 256 for k in range(200)], [(7 * k) % 256 for k in range(200)]
	llmc.write_datafile("n0/s_a.bin", a); llmc.write_datafile("n0/s_b.bin", b)
	llmc.write_datafile("n1/s_b.bin", b)  # s_a.bin missing
	llmc.write_datafile("n0/v.bin", a[:150]); llmc.write_datafile("n1/v.bin", a[:100])
	for d in ("same0", "same1"):
	    llmc.write_datafile(d + "/s_a.bin", a); llmc.write_datafile(d + "/s_b.bin", b)
	llmc.write_datafile("same0/v.bin", a[:150]); llmc.write_datafile("same1/v.bin", a[:150])
	EOF
    printf "#!/bin/sh\ncd \"\$1\$BMT_RANK\" && shift && exec \"\$@\"\n" >inrank && chmod +x inrank &&
    job="with_timeout 60 $BMLAUNCH --metrics-port 0 -n 2 --device cpu -- ./inrank" &&
    gpt="$BUILDDIR/bin/gpt2 -b 2 -t 16 --steps 2" &&
    { $job n $gpt --data "s_*.bin" >out 2>&1; rc=$?; } && test $rc -eq 1 &&
    grep -q "^[01]: gpt2: rank [01]: --data s_\*.bin does not match the same shards on every rank: rank 0 sees 2 shards (400 tokens), rank 1 sees 1 (200 tokens). Every rank reads its part of each global batch at the same position, so all must see the same shards (file names and sizes) in the same order: make each node.s copy of the data the same\$" out &&
    ! grep -q "step " out &&
    cp n0/s_a.bin n1/s_c.bin &&
    { $job n $gpt --data "s_*.bin" >out 2>&1; rc=$?; } && test $rc -eq 1 &&
    grep -q "rank 0 sees 2 shards (400 tokens), rank 1 sees as many, with other file names or sizes" out &&
    mv n1/s_c.bin n1/s_a.bin &&
    { $job n $gpt --data "s_*.bin" --val v.bin --eval-batches 3 >out 2>&1; rc=$?; } && test $rc -eq 1 &&
    grep -q "gpt2: rank [01]: --val v.bin does not match the same shards on every rank: rank 0 sees 1 shard (150 tokens), rank 1 sees 1 (100 tokens)" out &&
    $job same $gpt --data "s_*.bin" --val v.bin >out 2>&1 &&
    grep -q "^0: step   2/2 | val loss" out
'

test_done
