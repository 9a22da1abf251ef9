#!/bin/bash
# bench/gpu/build.sh — build the tree on the GPU machine (docs/building.md, "The
# GPU machine"): unpack the Debian packages carried in .device-deps into
# /opt/deps (never into /), then make with their headers and libraries.
# Jansson and GnuTLS link the system's libjansson.so.4 and libgnutls.so.30 by
# name (no unversioned links there; libgnutls28-dev gives the headers);
# libmicrohttpd (the collector) comes from /opt/deps, found at run time through
# an rpath. Output: $OUT/build.log; the last 30 lines on failure; exit status
# of make. Extra arguments go to make.
set -u
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT" /opt/deps
for f in .device-deps/*.deb; do
    [ -f "$f" ] || { echo "build.sh: no .device-deps/*.deb: carry .device-deps (docs/building.md)"; exit 2; }
    dpkg -x "$f" /opt/deps
done
D=/opt/deps/usr/lib/x86_64-linux-gnu
make -j"$(nproc)" CPPFLAGS=-I/opt/deps/usr/include JANSSON_LIBS=-l:libjansson.so.4 GNUTLS_LIBS=-l:libgnutls.so.30 \
    LDFLAGS="-L$D -Wl,-rpath,$D" "$@" >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
