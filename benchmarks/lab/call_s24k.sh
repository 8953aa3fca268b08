#!/usr/bin/env bash
# Session 24, call K: call J found evict_last's gain (x1.02-1.05) paid by the next kernel (a 40
# MB re-read 8-25% slower). The same probe at the policy's fraction 1.0, 0.5 and 0.25.
set -u
mkdir -p "$OUT"
timeout 300 python3 benchmarks/lab/l2hint_probe.py --out "$OUT" --rounds 7 \
  --trees evict_last,evict_last_half,evict_last_quarter 2>&1 | tee "$OUT/l2hint_probe.log"
