#!/bin/sh
# scripts/deps.sh — install the Debian packages bmt needs (make deps).
#
# Idempotent and non-interactive: packages already installed are left alone and
# nothing is downloaded when all are present. Runs apt-get as root, through sudo
# when not root. CUDA and NCCL are not Debian packages here: they are used from
# $CUDA_HOME (default /usr/local/cuda) when present, and skipped otherwise.
set -eu

PACKAGES="
gcc
make
pkg-config
libpmix-dev
libjansson-dev
python3
python3-numpy
python3-torch
procps
slurm-wlm
slurm-client
munge
iproute2
util-linux
clang-format
libcurl4-openssl-dev
libmicrohttpd-dev
libgnutls28-dev
libxxhash-dev
python3-xxhash
curl
prometheus
prometheus-pushgateway
prometheus-alertmanager
chromium
man-db
groff-base
clang
libclang-rt-14-dev
strace
faketime
python3-cryptography
"

missing=""
for p in $PACKAGES; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done

if [ -z "$missing" ]; then
    echo "deps: all $(echo $PACKAGES | wc -w) packages are installed"
    exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
    SUDO=""
elif command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
else
    echo "deps: missing packages:$missing" >&2
    echo "deps: run as root: apt-get install -y$missing" >&2
    exit 1
fi

echo "deps: installing$missing"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
echo "deps: done"
