#!/usr/bin/env bash
# Prepared in session 10 for the next session's first call: the fwd kernel's clusters with no
# release barriers (fc) and with one exchange per row (fc1), against the shipped winners
# (fwd_cluster_lab.py). Rebuild the two trees first (tree_patches/README.md).
set -u
mkdir -p "$OUT"
timeout 400 python3 benchmarks/lab/fwd_cluster_lab.py --out "$OUT" 2>&1 | grep -v "━" \
  | tee "$OUT/fwd_cluster_lab.log"
