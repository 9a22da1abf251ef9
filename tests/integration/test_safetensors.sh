#!/bin/bash
# The safetensors reader (bmt/safetensors.h) on real files written by
# tests/tools/st_write.py: a GPT-2-like file of 3 layers, the same model split
# over 2 shards with an index, every float dtype over more than one 4 MiB chunk.
# `test_safetensors DIR` (the unit test binary) compares every element it reads
# (whole tensors and odd sub-ranges, across the chunk boundary, F32/F16/BF16/F64
# to f32/bf16/f64) with numpy's and torch's values, counts the bytes each open
# and read takes from the files (/proc/self/io), and reads a file truncated
# after open. Then malformed files and indexes, each refused with its own
# message, through `test_safetensors --open`.
. "$(dirname "$0")/lib.sh"

T=$BUILDDIR/tests/unit/test_safetensors
PY=/usr/bin/python3
STW="$PY $SRC/tests/tools/st_write.py"
FX=$TMP/fx
export T STW FX

# refused FILE MESSAGE: opening FILE fails (exit 1), printing exactly MESSAGE and
# nothing on stdout.
refused() {
    local rc=0
    "$T" --open "$1" >out 2>err || rc=$?
    if [ $rc -eq 1 ] && [ ! -s out ] && [ "$(cat err)" = "$2" ]; then
        return 0
    fi
    echo "exit status $rc, stdout $(wc -c <out) bytes"
    echo "got:  $(cat err)"
    echo "want: $2"
    return 1
}
export -f refused

test_expect_success "st_write.py writes the fixtures (3-layer GPT-2, a 2-shard index, every float dtype)" '
    $STW fixtures $FX &&
    test -s $FX/gpt2/model.safetensors && test -s $FX/sharded/model.safetensors.index.json &&
    test -s $FX/sharded/model-00001-of-00002.safetensors &&
    test -s $FX/sharded/model-00002-of-00002.safetensors &&
    test $(grep -c "^read" $FX/cases.tsv) -ge 200
'

test_expect_success "every element read matches numpy/torch; open and read take exactly the bytes they need" '
    with_timeout 60 $T $FX >out && ! grep "^not ok" out &&
    test $(grep -c "^ok" out) -ge 1500 &&
    grep -q "^ok .* - read f16.big: took exactly 4194314 bytes from the file" out &&
    grep -q "^ok .* - read dtypes.safetensors f64.ties .* F64 -> bf16: every element matches" out &&
    grep -q "^ok .* - read sharded transformer.h.2.mlp.c_fc.weight \[0, +256) BF16 -> f32: every element matches" out &&
    grep -q "^ok .* - truncread: reading w of a file truncated after open fails" out
'

test_expect_success "the GPT-2 file: 40 tensors sorted by name with offsets, blocks head, h.0..h.2, tail" '
    $T --open $FX/gpt2/model.safetensors >out &&
    test "$(head -1 out)" = "40 tensors" &&
    sed -n "2,41p" out | cut -d" " -f1 >names && LC_ALL=C sort -c names &&
    grep -qx "h.0.attn.c_attn.weight F32 \[8, 24\] model.safetensors [0-9]* 768" out &&
    grep -qx "wte.weight F32 \[64, 8\] model.safetensors [0-9]* 2048" out &&
    test "$(tail -1 out)" = "plan: head(2) h.0(12) h.1(12) h.2(12) tail(2)"
'

test_expect_success "a directory holding the index opens both shards; discovery sees transformer.h.N" '
    $T --open $FX/sharded >out &&
    test "$(head -1 out)" = "41 tensors" &&
    test $(grep -c " model-00001-of-00002.safetensors " out) -eq 20 &&
    test $(grep -c " model-00002-of-00002.safetensors " out) -eq 21 &&
    grep -qx "lm_head.weight BF16 \[64, 8\] model-00002-of-00002.safetensors [0-9]* 1024" out &&
    test "$(tail -1 out)" = "plan: head(2) transformer.h.0(12) transformer.h.1(12) transformer.h.2(12) tail(3)"
'

test_expect_success "--read converts a sub-range (F64 wte in a shard) to the values numpy wrote" '
    $T --read $FX/sharded transformer.wte.weight 5 3 >out &&
    $PY -c "import numpy as np, sys; e = np.fromfile(sys.argv[1], \"<f4\")[5:8]; g = np.loadtxt(sys.argv[2], dtype=np.float32); sys.exit(0 if (e == g).all() else 1)" \
        "$FX/expect/sharded_model-00001-of-00002.safetensors/transformer.wte.weight.f32" out
'

test_expect_success "reads out of range or of an integer tensor are refused, naming file and tensor" '
    test_must_fail $T --read $FX/gpt2 ln_f.bias 6 3 2>err &&
    test "$(cat err)" = "model.safetensors: tensor '\''ln_f.bias'\'': 3 elements from element 6 are out of range (it has 8)" &&
    test_must_fail $T --read $FX/dtypes.safetensors i64.ids 0 4 2>err &&
    test "$(cat err)" = "dtypes.safetensors: tensor '\''i64.ids'\'': is I64; only F64, F32, F16 and BF16 convert to f32"
'

# preads FILE TRACE: "bytes offset" of each read of FILE in an strace -y log.
preads() {
    grep -E "^(pread64|read)\([0-9]+<[^>]*/$1>" "$2" |
        sed -E "s/.*, ([0-9]+), ([0-9]+)\) += ([0-9]+)\$/\1 \2 \3/; s/^read\(.*, ([0-9]+)\) += ([0-9]+)\$/\1 ? \2/"
}
export -f preads

if command -v strace >/dev/null 2>&1 && strace -o /dev/null true 2>/dev/null; then
    # LeakSanitizer cannot run under ptrace (ASAN=1 builds): no leak check there.
    NOLSAN="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
    export NOLSAN
    test_expect_success "strace: open preads 8 bytes and the header; a read preads exactly its byte range" '
        ASAN_OPTIONS=$NOLSAN strace -y -e trace=read,pread64 -o trace $T --read $FX/gpt2/model.safetensors h.1.mlp.c_fc.weight 11 7 >vals &&
        test $(wc -l <vals) -eq 7 &&
        n=$(od -An -t u8 -N8 $FX/gpt2/model.safetensors | tr -d " ") &&
        off=$($T --open $FX/gpt2/model.safetensors | sed -n "s/^h.1.mlp.c_fc.weight F32 .* \([0-9]*\) 1024\$/\1/p") &&
        preads model.safetensors trace >got &&
        printf "8 0 8\n$n 8 $n\n28 $((off + 44)) 28\n" >want && diff -u want got
    '
    test_expect_success "strace: a malformed file is refused having read only its length and header" '
        $STW raw bad.safetensors a:F32:4:0,16 b:F32:4:8,24 &&
        ASAN_OPTIONS=$NOLSAN strace -y -e trace=read,pread64 -o trace $T --open bad.safetensors 2>err >/dev/null || true &&
        grep -q "overlap" err && n=$(od -An -t u8 -N8 bad.safetensors | tr -d " ") &&
        preads bad.safetensors trace >got && printf "8 0 8\n$n 8 $n\n" >want && diff -u want got
    '
else
    echo "# skipped: strace is missing or cannot trace here; byte ranges are still counted by test 2"
fi

# ---------------------------------------------------------------- malformed files
Q="'"

test_expect_success "truncated data: a tensor that runs past the end of the file" '
    $STW raw bad.safetensors a:F32:4:0,16 b:F32:4:16,32 --data 20 &&
    refused bad.safetensors "bad.safetensors: tensor ${Q}b${Q}: data_offsets [16, 32] run past the data section (20 bytes)"
'

test_expect_success "a header length beyond the file, and over the 100 MB limit" '
    $STW raw bad.safetensors a:F32:4:0,16 --hdrlen 4096 &&
    size=$(stat -c %s bad.safetensors) &&
    refused bad.safetensors "bad.safetensors: header length 4096 runs past the end of the file ($size bytes)" &&
    $STW raw big.safetensors --hdrlen 100000001 &&
    refused big.safetensors "big.safetensors: header length 100000001 is over the limit of 100000000 bytes" &&
    printf abc >short.safetensors &&
    refused short.safetensors "short.safetensors: file is 3 bytes, too short for the 8-byte header length"
'

test_expect_success "overlapping offsets, a hole and bytes after the last tensor" '
    $STW raw bad.safetensors a:F32:4:0,16 b:F32:4:8,24 &&
    refused bad.safetensors "bad.safetensors: tensors ${Q}a${Q} [0, 16] and ${Q}b${Q} [8, 24] overlap" &&
    $STW raw hole.safetensors a:F32:4:0,16 b:F32:2:24,32 &&
    refused hole.safetensors "hole.safetensors: bytes [16, 24) of the data section belong to no tensor (a hole before ${Q}b${Q})" &&
    $STW raw tail.safetensors a:F32:4:0,16 --data 17 &&
    refused tail.safetensors "tail.safetensors: bytes [16, 17) at the end of the data section belong to no tensor"
'

test_expect_success "an unknown dtype, a shape that does not match its bytes, decreasing offsets" '
    $STW raw bad.safetensors a:F33:4:0,16 &&
    refused bad.safetensors "bad.safetensors: tensor ${Q}a${Q}: unknown dtype ${Q}F33${Q}" &&
    $STW raw shape.safetensors a:F32:2x3:0,20 &&
    refused shape.safetensors "shape.safetensors: tensor ${Q}a${Q}: data_offsets [0, 20] hold 20 bytes; F32 [2, 3] needs 24" &&
    $STW raw model-00002-of-00003.safetensors h.3.attn.c_attn.weight:U8:10:100,90 --data 100 &&
    refused model-00002-of-00003.safetensors "model-00002-of-00003.safetensors: tensor ${Q}h.3.attn.c_attn.weight${Q}: data_offsets [100, 90] are not increasing"
'

test_expect_success "a header that is not a JSON object, or not JSON" '
    $STW raw arr.safetensors --header "[1, 2]" &&
    refused arr.safetensors "arr.safetensors: header is not a JSON object (it starts with ${Q}[${Q})" &&
    $STW raw cut.safetensors --header "{\"a\": " &&
    refused cut.safetensors "cut.safetensors: header is not valid JSON: unexpected token near end of file (at byte 6)" &&
    $STW raw meta.safetensors --header "{\"__metadata__\": {\"n\": 1}}" &&
    refused meta.safetensors "meta.safetensors: __metadata__ ${Q}n${Q} is not a string"
'

# shards s1 (a, b) and s2 (c) for the index cases
shards='$STW raw s1.safetensors a:F32:4:0,16 b:F32:2:16,24 && $STW raw s2.safetensors c:F32:1:0,4'

test_expect_success "a well-formed index of two shards opens (the directory holding it)" '
    eval "$shards" && $STW index model.safetensors.index.json a=s1.safetensors b=s1.safetensors c=s2.safetensors --meta total_size=28 &&
    $T --open . >out && test "$(head -1 out)" = "3 tensors" &&
    grep -qx "c F32 \[1\] s2.safetensors [0-9]* 4" out && test "$(tail -1 out)" = "plan: head(0) tail(3)"
'

test_expect_success "a directory holding model.safetensors and an index reads model.safetensors alone, as transformers' from_pretrained does: the index is not opened" '
    eval "$shards" && $STW index model.safetensors.index.json a=s1.safetensors b=s1.safetensors c=s2.safetensors &&
    $STW raw model.safetensors x:F32:2:0,8 &&
    $T --open . >out && cat out && test "$(head -1 out)" = "1 tensors" &&
    grep -qx "x F32 \[2\] model.safetensors [0-9]* 8" out &&
    echo "{" >model.safetensors.index.json && $T --open . >out && test "$(head -1 out)" = "1 tensors" &&
    refused model.safetensors.index.json "model.safetensors.index.json: not valid JSON: string or ${Q}}${Q} expected near end of file (at byte 2)"
'

test_expect_success "beside an index, a bad model.safetensors is refused, never passed over for the index; a dangling link is no file (the index is read)" '
    eval "$shards" && $STW index model.safetensors.index.json a=s1.safetensors b=s1.safetensors c=s2.safetensors &&
    $STW raw model.safetensors --header "{\"a\": " &&
    refused . "model.safetensors: header is not valid JSON: unexpected token near end of file (at byte 6)" &&
    rm model.safetensors && mkfifo model.safetensors &&
    rc=0 && { with_timeout 10 $T --open . >out 2>err || rc=$?; } &&
    cat err && test $rc -eq 1 && grep -q "model.safetensors: not a regular file\$" err &&
    rm model.safetensors && mkdir model.safetensors &&
    rc=0 && { $T --open . >out 2>err || rc=$?; } && cat err && test $rc -eq 1 &&
    rmdir model.safetensors && ln -s nowhere.safetensors model.safetensors &&
    $T --open . >out && test "$(head -1 out)" = "3 tensors"
'

test_expect_success "an index naming a missing file" '
    eval "$shards" && $STW index idx.json a=s1.safetensors b=s1.safetensors c=s3.safetensors &&
    refused idx.json "s3.safetensors: cannot open: No such file or directory"
'

test_expect_success "an index naming a tensor its file lacks, or putting one in the wrong file" '
    eval "$shards" &&
    $STW index idx.json a=s1.safetensors b=s1.safetensors c=s2.safetensors d=s2.safetensors &&
    refused idx.json "s2.safetensors: tensor ${Q}d${Q}: not in the file, but idx.json${Q}s weight_map puts it there" &&
    $STW index idx2.json a=s1.safetensors b=s2.safetensors c=s2.safetensors &&
    refused idx2.json "idx2.json: tensor ${Q}b${Q}: is in ${Q}s1.safetensors${Q}, but weight_map says ${Q}s2.safetensors${Q}" &&
    $STW index idx3.json a=s1.safetensors c=s2.safetensors &&
    refused idx3.json "s1.safetensors: tensor ${Q}b${Q}: not in idx3.json${Q}s weight_map"
'

test_expect_success "an index whose files escape its directory (../ or absolute) is refused before opening them" '
    eval "$shards" && mkdir sub && cp s1.safetensors s2.safetensors sub/ &&
    $STW index sub/idx.json a=../s1.safetensors b=s1.safetensors c=s2.safetensors &&
    refused sub/idx.json "idx.json: tensor ${Q}a${Q}: file ${Q}../s1.safetensors${Q} is outside the index${Q}s directory" &&
    $STW index sub/idx2.json a=s1.safetensors b=s1.safetensors c=$PWD/s2.safetensors &&
    refused sub/idx2.json "idx2.json: tensor ${Q}c${Q}: file ${Q}$PWD/s2.safetensors${Q} is outside the index${Q}s directory" &&
    $STW index sub/idx3.json a=s1.safetensors b=s1.safetensors c=x/../../s2.safetensors &&
    refused sub/idx3.json "idx3.json: tensor ${Q}c${Q}: file ${Q}x/../../s2.safetensors${Q} is outside the index${Q}s directory"
'

test_expect_success "the same tensor in two shards is refused" '
    eval "$shards" && $STW raw s3.safetensors c:F32:1:0,4 &&
    $STW index idx.json a=s1.safetensors b=s1.safetensors c=s2.safetensors x=s3.safetensors &&
    refused idx.json "idx.json: tensor ${Q}c${Q}: is in both ${Q}s2.safetensors${Q} and ${Q}s3.safetensors${Q}"
'

test_expect_success "an index that is not JSON, or has no weight_map; a directory with neither file" '
    printf "{\"weight_map\": " >idx.json &&
    refused idx.json "idx.json: not valid JSON: unexpected token near end of file (at byte 15)" &&
    echo "{\"metadata\": {}}" >idx2.json &&
    refused idx2.json "idx2.json: no \"weight_map\" object" &&
    mkdir empty && refused empty "empty: holds neither model.safetensors.index.json nor model.safetensors" &&
    refused nothere.safetensors "nothere.safetensors: cannot open: No such file or directory"
'

test_expect_success "a FIFO as a file, an index or a directory's model.safetensors is refused at once, not waited on" '
    mkfifo ff.safetensors ff.json && mkdir fdir && mkfifo fdir/model.safetensors &&
    for f in ff.safetensors ff.json fdir; do
        rc=0 && { with_timeout 10 $T --open $f >out 2>err || rc=$?; } &&
        echo "$f: exit $rc: $(cat err)" && test $rc -eq 1 && grep -q "not a regular file\$" err || exit 1
    done
'

test_expect_success "a layer missing from the stack: the plan is refused, naming the layer" '
    $STW raw gap.safetensors h.0.w:F32:1:0,4 h.1.w:F32:1:4,8 h.3.w:F32:1:8,12 &&
    rc=0 && { $T --open gap.safetensors >out 2>err || rc=$?; } && test $rc -eq 2 &&
    test "$(cat err)" = "gap.safetensors: layer ${Q}h.2${Q} is missing: the stack goes up to ${Q}h.3${Q} but has no tensor of layer 2" &&
    test "$(head -1 out)" = "3 tensors"
'

test_done
