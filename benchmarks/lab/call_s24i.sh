#!/usr/bin/env bash
# Session 24, call I: call H's evict_last gain checked for reuse across launches (2 and 4 input
# sets) and for its cost to the next kernel (a 16 / 40 MB buffer's second read after one launch).
set -u
mkdir -p "$OUT"
timeout 300 python3 benchmarks/lab/l2hint_probe.py --out "$OUT" --rounds 7 2>&1 | tee "$OUT/l2hint_probe.log"
