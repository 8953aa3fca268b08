#!/usr/bin/env bash
# Session 14: the capture query's cost before a bulk launch, 00e790a6c1f2f2a8f57567d8519721bed86ca882 (old, before the change) against HEAD (new) in
# alternating processes at bf16 16384 rows 512 (the bulk kernel), then the GPU suite on HEAD.
set -u
mkdir -p "$OUT"
L=benchmarks/lab
rm -rf $L/old_tree && mkdir -p $L/old_tree && git archive 00e790a6c1f2f2a8f57567d8519721bed86ca882 autonorm templates tuning_db | tar -x -C $L/old_tree
for i in 1 2; do
  for tree in old new; do
    if [[ $tree == old ]]; then root=$PWD/$L/old_tree; else root=$PWD; fi
    echo "== $tree run $i" | tee -a "$OUT/host_bulk_ab.log"
    PYTHONPATH=/tmp/site:$root:$PWD/$L timeout 45 python3 $L/host_launch_probe.py --rows 512 2>&1 \
      | grep -v Warning | tail -3 | tee -a "$OUT/host_bulk_ab.log"
  done
done
timeout 235 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider -ra > "$OUT/gpu_tests_s14f.log" 2>&1
tail -6 "$OUT/gpu_tests_s14f.log"
