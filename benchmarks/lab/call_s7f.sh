#!/usr/bin/env bash
# Session 7, call F: the untuned 16-bit default against capped variants (lab/default_cap_lab.py).
set -u
mkdir -p "$OUT"
timeout 150 python3 benchmarks/lab/default_cap_lab.py --dtypes bfloat16 --out "$OUT" 2>&1 \
  | grep -v "━" | tee "$OUT/default_cap_lab.log"
mv "$OUT/default_cap_lab.json" "$OUT/default_cap_lab_bf16.json" 2>/dev/null
timeout 70 python3 benchmarks/lab/default_cap_lab.py --dtypes float16 --out "$OUT" 2>&1 \
  | grep -v "━" | tee -a "$OUT/default_cap_lab.log"
