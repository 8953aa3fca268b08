#!/usr/bin/env bash
# Session 9, call A: what the wide-row winners pay for (decompose_lab.py): weight/bias loads,
# L1 priority for them, streaming y stores, a 40-register cap with and without weight/bias.
set -u
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
timeout 420 python3 benchmarks/lab/decompose_lab.py --out "$OUT" 2>&1 | grep -v "━" \
  | tee "$OUT/decompose_lab.log"
