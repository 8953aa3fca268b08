#!/usr/bin/env bash
# Prepared in session 15 (~2 min): occupancy_lab --more, three to five bulk blocks an SM at finer
# clusters (t128 c4 at 16-bit 32768, t128 c8 at bf16 65536, t256 c8 at fp32 65536, t128 at
# 16384) against each shape's shipped winner, verified, interleaved (NOTES.md 77's next step).
set -u
mkdir -p "$OUT"
timeout 400 python3 benchmarks/lab/occupancy_lab.py --more --rounds 5 --out "$OUT" 2>&1 \
  | grep -v Warning | tee "$OUT/occupancy_more.log"
