#!/usr/bin/env bash
# Session 12, call A: bulk kernel, one block barrier fewer a tile (the refill after the first row
# sum's barrier: same iteration for an fp32 tile in registers, next iteration for a tile read from
# shared memory) and fp32's pass-2 sums through one barrier. The schedule and bulk GPU tests on
# the new templates, then A/B against templates_base (git archive HEAD templates).
set -u
mkdir -p "$OUT"
timeout 200 python3 -m pytest -q -m gpu tests/test_gpu_schedule.py tests/test_gpu_bulk.py \
  -p no:cacheprovider -ra --durations=5 > "$OUT/gpu_sched_bulk.log" 2>&1; tail -12 "$OUT/gpu_sched_bulk.log"
timeout 230 python3 benchmarks/lab/ab_lab.py --base benchmarks/lab/templates_base --cache bulk \
  --top 2 --rounds 3 --budget-s 200 --out "$OUT/bulk" \
  --only bfloat16:32768,bfloat16:65536,float16:32768,float16:65536,float32:12288,float32:16384,float32:32768,float32:65536,bfloat16:16384,float16:16384,bfloat16:12288 \
  2>&1 | grep -v "━" | tee "$OUT/ab_bulk.log" | grep -v "^\s*$" | tail -40
timeout 80 python3 benchmarks/lab/ab_lab.py --base benchmarks/lab/templates_base \
  --top 1 --rounds 3 --budget-s 60 --out "$OUT/fwd" \
  --only bfloat16:16384,float16:16384,bfloat16:12288 \
  2>&1 | grep -v "━" | tee "$OUT/ab_fwdref.log" | grep SHAPE
