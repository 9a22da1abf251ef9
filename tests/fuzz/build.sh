#!/bin/bash
# tests/fuzz/build.sh OUTDIR — build the libFuzzer targets of tests/fuzz/*.c into
# OUTDIR with clang, straight from the sources they need (runtime/safetensors.c
# and the three small files it links against), so no Makefile rule is involved:
#
#   st_header   bmt_st_parse (and bmt_st_discover on what it accepts)
#   st_index    bmt_st_parse_index (an index with its shard headers in memory)
#   st_convert  bmt_st_convert, every source dtype to every destination
#
# Exit 0: built; 77: clang or its libFuzzer runtime is missing (the reason on
# stdout, for a "# skipped:" line); anything else: a compile error (on stderr).
# FUZZ_CC picks the compiler (default: clang, else clang-14).
set -eu
out=${1:?usage: tests/fuzz/build.sh OUTDIR}
src=$(cd "$(dirname "$0")/../.." && pwd)
cc=${FUZZ_CC:-}
if [ -z "$cc" ]; then
    for c in clang clang-14; do
        if command -v "$c" >/dev/null 2>&1; then cc=$c; break; fi
    done
fi
if [ -z "$cc" ] || ! command -v "$cc" >/dev/null 2>&1; then
    echo "${cc:-clang} is not installed (Debian: apt-get install clang libclang-rt-14-dev)"
    exit 77
fi
mkdir -p "$out"
# libFuzzer ships apart from clang on Debian (libclang-rt-14-dev): probe it.
printf '#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n);\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n' \
    >"$out/probe.c"
if ! "$cc" -fsanitize=fuzzer,address,undefined "$out/probe.c" -o "$out/probe" 2>"$out/probe.log"; then
    echo "$cc cannot link -fsanitize=fuzzer,address,undefined (Debian: apt-get install clang libclang-rt-14-dev): $(grep -m1 -i error "$out/probe.log" | cut -c1-120)"
    exit 77
fi
rm -f "$out/probe" "$out/probe.c" "$out/probe.log"
jansson_cflags=$(pkg-config --cflags jansson 2>/dev/null || true)
jansson_libs=$(pkg-config --libs jansson 2>/dev/null || echo -ljansson)
# shellcheck disable=SC2054 # the commas are -fsanitize's
flags=(-std=c11 -D_GNU_SOURCE -g -O1 -fno-omit-frame-pointer
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
    -Wall -Wextra -Wshadow -Wvla -Wno-unused-parameter -I"$src/include" -I"$src/runtime")
lib=("$src/runtime/safetensors.c" "$src/runtime/checksum.c" "$src/runtime/error.c" "$src/runtime/dtype.c")
for t in st_header st_index st_convert; do
    # shellcheck disable=SC2086
    "$cc" "${flags[@]}" $jansson_cflags "$src/tests/fuzz/$t.c" "${lib[@]}" $jansson_libs -lm \
        -o "$out/$t.tmp"
    mv "$out/$t.tmp" "$out/$t"
done
