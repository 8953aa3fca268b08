#!/usr/bin/env bash
# Session 22, call C: streaming y stores in the fwd kernel (templates_cs) against the product.
set -u
mkdir -p "$OUT"
timeout 540 python3 benchmarks/lab/cs_lab.py --rounds 5 --out "$OUT" > "$OUT/cs_lab.log" 2>&1
grep -v "━" "$OUT/cs_lab.log" | tail -90
