#!/usr/bin/env bash
# Session 6, call A (tree: wip/pair-sums): the kernel GPU tests on the pair-sum templates, then
# family_lab: which kernel families the 24-trial grid search misses, against the shipped winners.
set -u
mkdir -p "$OUT"
timeout 200 python3 -m pytest -q -m gpu tests/test_gpu_kernels.py tests/test_gpu_bulk.py \
  -p no:cacheprovider -ra --durations=5 > "$OUT/gpu_tests_kernels_bulk.log" 2>&1
tail -8 "$OUT/gpu_tests_kernels_bulk.log"
timeout 330 python3 benchmarks/lab/family_lab.py --out "$OUT" --per-family 6 --budget-s 290 \
  --only bfloat16:16384,bfloat16:4096,bfloat16:8192,float16:8192,bfloat16:2048,float32:16384,bfloat16:12288,float32:12288,bfloat16:32768,bfloat16:768,bfloat16:1024,float32:32768 \
  2>&1 | grep -v Warning | tee "$OUT/family_lab.log"
