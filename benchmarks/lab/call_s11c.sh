#!/usr/bin/env bash
# Session 11, call C: dynamic tiles in the bulk kernel (dyn_lab.py against the product), then the
# timelines of the dynamic kernels. templates_dyn: tree_patches/templates_dyn.patch.
set -u
mkdir -p "$OUT"
timeout 330 python3 benchmarks/lab/dyn_lab.py --out "$OUT" 2>&1 | grep -v "━" | tee "$OUT/dyn_lab.log"
timeout 90 python3 benchmarks/lab/timeline_lab.py --tree dyn --only 32768,65536 --out "$OUT" 2>&1 \
  | tee "$OUT/timeline_dyn.log"
