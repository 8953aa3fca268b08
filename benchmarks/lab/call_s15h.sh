#!/usr/bin/env bash
# Session 15, call H (~4.5 min): after NOTES.md 77's product change (weights in registers decided
# at the blocks reached; t256 clustered bulk seeds ahead of t1024): 60 trials on bf16 / fp16
# 65536 and fp32 32768, merged into the shipped DB with merge_db's 1-point margin, then the
# bulk kernel's GPU tests on the changed code.
set -u
mkdir -p "$OUT"
bash benchmarks/gpu_checks.sh search bf16:65536 fp16:65536 fp32:32768
timeout 80 python3 -m pytest -q -m gpu tests/test_gpu_bulk.py -p no:cacheprovider -ra \
  > "$OUT/gpu_tests_bulk.log" 2>&1; tail -3 "$OUT/gpu_tests_bulk.log"
