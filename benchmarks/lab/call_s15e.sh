#!/usr/bin/env bash
# Session 15, call E (~1-2 min): lab/copy_lab.py: cudaMemcpy against SM copies (grid-stride,
# bulk-engine loads and stores, bulk loads with thread stores, threads then a bulk store) and the
# bf16 32768 / 65536 bulk winners, same bytes, same run.
set -u
mkdir -p "$OUT"
timeout 300 python3 benchmarks/lab/copy_lab.py --out "$OUT" 2>&1 | grep -v Warning \
  | tee "$OUT/copy_lab.log"
