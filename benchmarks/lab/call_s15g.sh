#!/usr/bin/env bash
# Session 15, call G (~2-3 min): lab/occupancy_lab.py: two bulk blocks an SM at the wide rows
# (t256 c2 at bf16 32768, t256 c4 at 65536 and fp32 32768), and weights in registers decided at
# the occupancy reached ("fixed") against the shipped winners, verified, interleaved.
set -u
mkdir -p "$OUT"
timeout 400 python3 benchmarks/lab/occupancy_lab.py --rounds 5 --out "$OUT" 2>&1 \
  | grep -v Warning | tee "$OUT/occupancy_lab.log"
