#!/usr/bin/env bash
# Session 24, call G: the bulk kernel's x copies hinted L2::evict_first (and the evict_unchanged
# control) against the product at the shipped bulk winners (l2hint_lab.py, 9 rounds): both the
# back-to-back regime (each launch writes back the last one's dirty y) and single launches
# after a read flush (the peers' and the finals' regime).
set -u
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$OUT/smi.txt"
timeout 450 python3 benchmarks/lab/l2hint_lab.py --out "$OUT" --rounds 9 2>&1 | tee "$OUT/l2hint_lab.log" | grep -v "^$"
