#!/usr/bin/env bash
# host_launch_probe.py in alternating processes, an old tree against the working tree, N rounds,
# since the host's state moves these figures 1.5-2x (NOTES.md 62). Run from the repo root on the
# GPU machine: bash benchmarks/lab/host_ab.sh OLD_ROOT ROUNDS LOG [probe args...]
# (call_s13c.sh and call_s14f.sh ran the same loop written out.)
set -u
old_root=$1 rounds=$2 log=$3
shift 3
L=benchmarks/lab
for ((i = 1; i <= rounds; i++)); do
  for tree in old new; do
    if [[ $tree == old ]]; then root=$old_root; else root=$PWD; fi
    echo "== $tree run $i" | tee -a "$log"
    PYTHONPATH=/tmp/site:$root:$PWD/$L timeout 45 python3 $L/host_launch_probe.py "$@" 2>&1 \
      | grep -v Warning | tail -3 | tee -a "$log"
  done
done
