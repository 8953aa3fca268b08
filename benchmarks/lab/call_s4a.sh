#!/usr/bin/env bash
# Session 4, call A: the corrected fp32 two-pass and the bulk kernel's fp32 tile on the GPU.
# GPU tests of the kernels first, then same-run A/B against the templates of 47e5d78.
set -u
mkdir -p "$OUT"
timeout 200 python3 -m pytest -q -m gpu tests/test_gpu_kernels.py tests/test_gpu_bulk.py \
  -p no:cacheprovider -ra --durations=5 > "$OUT/gpu_tests_a.log" 2>&1
tail -12 "$OUT/gpu_tests_a.log"
timeout 150 python3 benchmarks/lab/ab_lab.py --base benchmarks/lab/templates_base \
  --only float32:768,float32:4096,float32:8192,float32:16384,float32:32768,float32:65536 \
  --top 2 --rounds 4 --budget-s 130 --out "$OUT/ab_fp32" > "$OUT/ab_fp32.log" 2>&1
cat "$OUT/ab_fp32.log" | grep -v "^\s*$" | tail -30
timeout 150 python3 benchmarks/lab/ab_lab.py --base benchmarks/lab/templates_base --ftile \
  --only bfloat16:4096,bfloat16:8192,bfloat16:16384,bfloat16:32768,float16:8192,float16:16384 \
  --top 2 --rounds 4 --budget-s 130 --out "$OUT/ab_ftile" > "$OUT/ab_ftile.log" 2>&1
cat "$OUT/ab_ftile.log" | grep -v "^\s*$" | tail -30
