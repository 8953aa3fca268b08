#!/usr/bin/env bash
# Session 23, call B: the other stages' first tiles requested a fixed delay after stage 0's
# (delay_lab.py, trees templates_d0/1000/2000/4000), and the three shapes session 22's merge kept
# by its margin, head to head with the config that measured better there. 9 rounds.
set -u
mkdir -p "$OUT"
timeout 560 python3 benchmarks/lab/delay_lab.py --out "$OUT" --rounds 9 2>&1 | tee "$OUT/delay_lab.log" | grep -v "^$"
