#!/usr/bin/env bash
# Session 14, last call: the shared-memory carveout of the shipped winners (carveout_lab.py),
# then a timeline of the fwd winner at bf16 16384 (its first wave and drain; NOTES.md next (e)).
set -u
mkdir -p "$OUT"
timeout 300 python3 benchmarks/lab/carveout_lab.py --out "$OUT" --rounds 7 2>&1 | grep -v "━" \
  | tee "$OUT/carveout_lab.log" | tail -90
timeout 80 python3 benchmarks/lab/timeline_lab.py --only 16384 --runs 5 --out "$OUT" 2>&1 \
  | grep -v "━" | tee "$OUT/timeline_fwd.log" | tail -14
