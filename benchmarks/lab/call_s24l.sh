#!/usr/bin/env bash
# Session 24, call L: evict_last's gain against the loss of the GEMM that follows (l2hint_e2e.py).
set -u
mkdir -p "$OUT"
timeout 240 python3 benchmarks/lab/l2hint_e2e.py --out "$OUT" --rounds 7 2>&1 | tee "$OUT/l2hint_e2e.log"
