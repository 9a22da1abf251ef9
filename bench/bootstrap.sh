#!/bin/bash
# bench/bootstrap.sh — how long a job takes to start and build its communicators'
# membership, from 8 to 1000 ranks, locally (bmlaunch as the PMIx server) and under
# Slurm (srun --mpi=pmix on a private one-node cluster, tests/slurm/cluster.sh).
#
#   bench/bootstrap.sh [SIZES...]      (default: 8 64 256 1000; needs root for Slurm)
#
# The program is build/tests/progs/bootcheck with the "none" backend: PMIx init,
# layout, group and replica membership, one publication of every rank's record
# and the checks (each rank fetches its group's and replica's records; rank 0
# all). Time is the whole bmlaunch (or salloc + bmlaunch) wall time, best of 3,
# with the metrics endpoint off (--metrics-port 0) and on (the default: every
# rank loads the push plugin, which links libcurl, and the collector serves).
# Layouts: 8 = 2x4, 64 = 8x8, 256 = 16x16, 1000 = 40x25. Not a test.
set -u
cd "$(dirname "$0")/.."
B=build/bin/bmlaunch
P=build/tests/progs/bootcheck
sizes=${*:-8 64 256 1000}
layout() { case $1 in 8) echo "2 4" ;; 64) echo "8 8" ;; 256) echo "16 16" ;; 1000) echo "40 25" ;;
    *) echo "1 $1" ;; esac; }
best() { # command... -> best wall seconds of 3 runs
    local best= t
    for i in 1 2 3; do
        local s=$(date +%s.%N)
        "$@" >/dev/null 2>&1 || { echo fail; return; }
        t=$(awk -v a=$s -v b=$(date +%s.%N) 'BEGIN { printf "%.2f", b - a }')
        if [ -z "$best" ] || awk -v t=$t -v b=$best 'BEGIN { exit !(t < b) }'; then best=$t; fi
    done
    echo "$best"
}
declare -A local_s slurm_s local_m slurm_m
for n in $sizes; do
    set -- $(layout $n)
    local_s[$n]=$(best timeout 300 $B --metrics-port 0 -g $1 -n $2 --timeout 120 -- $P)
    local_m[$n]=$(best timeout 300 $B -g $1 -n $2 --timeout 120 -- $P)
done
have_slurm=0
if [ "$(id -u)" -eq 0 ] && . tests/slurm/cluster.sh && slurm_start one 64; then
    have_slurm=1
    for n in $sizes; do
        set -- $(layout $n)
        slurm_s[$n]=$(best timeout 300 salloc -N1 -n $n --overcommit $B --metrics-port 0 -g $1 -n $2 --timeout 120 -- $P)
        slurm_m[$n]=$(best timeout 300 salloc -N1 -n $n --overcommit $B -g $1 -n $2 --timeout 120 -- $P)
    done
    slurm_stop
fi
printf "bench/bootstrap: %s, %d cores\n" "$(uname -n)" "$(nproc)"
per_rank() { awk -v t=$1 -v n=$2 'BEGIN { if (t + 0 > 0) printf "%.1f", t * 1000 / n; else print "-" }'; }
printf "%-6s %-7s %9s %8s %11s %9s %8s %11s\n" ranks layout "local s" "ms/rank" "+metrics s" \
    "slurm s" "ms/rank" "+metrics s"
for n in $sizes; do
    set -- $(layout $n)
    l=${local_s[$n]} s=${slurm_s[$n]:-n/a}
    printf "%-6s %-7s %9s %8s %11s %9s %8s %11s\n" $n "${1}x${2}" "$l" "$(per_rank $l $n)" \
        "${local_m[$n]}" "$s" "$(per_rank $s $n)" "${slurm_m[$n]:-n/a}"
done
[ $have_slurm -eq 1 ] || echo "(no Slurm column: needs root and slurm-wlm, see tests/slurm/cluster.sh)"
