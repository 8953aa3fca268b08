#!/usr/bin/env bash
# Session 11, call D: the dynamic schedule landed in the product templates. Its GPU tests and the
# bulk tests, then an A/B against the templates before it (templates_base = git archive 5aa022e).
set -u
mkdir -p "$OUT"
timeout 230 python3 -m pytest -q -m gpu tests/test_gpu_schedule.py tests/test_gpu_bulk.py \
  -p no:cacheprovider -ra --durations=8 > "$OUT/gpu_sched_bulk.log" 2>&1; tail -25 "$OUT/gpu_sched_bulk.log"
timeout 200 python3 benchmarks/lab/ab_lab.py --base benchmarks/lab/templates_base --cache bulk \
  --top 2 --rounds 3 --budget-s 150 --out "$OUT" \
  --only bfloat16:32768,float16:65536,bfloat16:65536,float32:65536,float32:16384,float32:32768 \
  2>&1 | grep -v "━" | tee "$OUT/ab_dyn.log" | tail -30
