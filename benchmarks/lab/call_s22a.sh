#!/usr/bin/env bash
# Session 22, call A: the warps' totals summed by butterfly (templates_merge) against the product,
# same configs interleaved (merge_lab.py).
set -u
mkdir -p "$OUT"
timeout 500 python3 benchmarks/lab/merge_lab.py --rounds 5 --out "$OUT" > "$OUT/merge_lab.log" 2>&1
grep -v "━" "$OUT/merge_lab.log" | tail -60
