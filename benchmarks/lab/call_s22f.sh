#!/usr/bin/env bash
# Session 22, call F: plain y stores in the bulk kernel (templates_plain) against the product.
set -u
mkdir -p "$OUT"
timeout 400 python3 benchmarks/lab/plain_lab.py --rounds 7 --out "$OUT" > "$OUT/plain_lab.log" 2>&1
grep -v "━" "$OUT/plain_lab.log" | tail -60
