#!/usr/bin/env bash
# Session 8, call I: the 40-register cap lab (regcap40_lab.py), as run.
set -u
mkdir -p "$OUT"
timeout 150 python3 benchmarks/lab/regcap40_lab.py --out "$OUT" 2>&1 | grep -v "━" \
  | tee "$OUT/regcap40_lab.log"
