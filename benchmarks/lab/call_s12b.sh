#!/usr/bin/env bash
# Session 12, call B: the deferred refill for unclustered kernels only (clusters ran x0.91-1.00
# with it in call A), fp32 pass-2 pairing everywhere. Bulk and schedule tests, then A/B against
# templates_base with 5 rounds.
set -u
mkdir -p "$OUT"
timeout 150 python3 -m pytest -q -m gpu tests/test_gpu_schedule.py tests/test_gpu_bulk.py \
  -p no:cacheprovider -ra > "$OUT/gpu_sched_bulk_b.log" 2>&1; tail -3 "$OUT/gpu_sched_bulk_b.log"
timeout 250 python3 benchmarks/lab/ab_lab.py --base benchmarks/lab/templates_base --cache bulk \
  --top 2 --rounds 5 --budget-s 220 --out "$OUT/bulk" \
  --only bfloat16:32768,float16:32768,float32:12288,float32:16384,float32:65536,bfloat16:65536,float16:16384,float32:32768 \
  2>&1 | grep -v "━" | tee "$OUT/ab_bulk_b.log" | grep -v "^\s*$" | tail -30
