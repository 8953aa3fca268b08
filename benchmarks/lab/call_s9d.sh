#!/usr/bin/env bash
# Session 9, call D: pass 3's weight/bias loads issued earlier or unrolled differently (p3_lab.py).
set -u
mkdir -p "$OUT"
timeout 420 python3 benchmarks/lab/p3_lab.py --out "$OUT" 2>&1 | grep -v "━" | tee "$OUT/p3_lab.log"
