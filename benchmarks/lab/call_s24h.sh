#!/usr/bin/env bash
# Session 24, call H: call G found x's copies hinted evict_first x0.95-0.98 in both regimes
# (control x0.994-1.006). The opposite hint: x's lines kept in L2 (evict_last, all of them or
# half), same shapes, 9 rounds.
set -u
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$OUT/smi.txt"
timeout 450 python3 benchmarks/lab/l2hint_lab.py --out "$OUT" --rounds 9 \
  --policies evict_last,evict_last_half 2>&1 | tee "$OUT/l2hint_lab.log" | grep -v "^$"
