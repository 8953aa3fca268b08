#!/usr/bin/env bash
# Session 9, call C: RT rows per thread sharing one weight/bias load (rt_lab.py, templates_rt).
set -u
mkdir -p "$OUT"
timeout 420 python3 benchmarks/lab/rt_lab.py --out "$OUT" 2>&1 | grep -v "━" | tee "$OUT/rt_lab.log"
