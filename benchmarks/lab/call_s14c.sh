#!/usr/bin/env bash
# Session 14: the working tree's templates (stagger landed in layernorm_bulk.cu.j2, plus the two
# macro cleanups) re-tuned for the shipped DB, then the timelines of the staggered bulk kernels
# with a stamped copy for reference.
set -u
mkdir -p "$OUT"
bash benchmarks/gpu_checks.sh ship 2>&1 | grep -v "━" | tail -30
timeout 110 python3 benchmarks/lab/timeline_lab.py --only 32768,65536 --runs 5 --out "$OUT" \
  --copy 2>&1 | grep -v "━" | tee "$OUT/timeline_stagger.log" | tail -32
