#!/usr/bin/env bash
# Session 10, call A: the finals' single-launch regime's GPU tests, then clustered smem kernels
# under the 64-register cap against the bulk winners at 16-bit 32768/65536 (cluster_cap_lab.py),
# each timed back to back and in single launches.
set -u
mkdir -p "$OUT"
timeout 150 python3 -m pytest -q -m gpu tests/test_gpu_bench.py -p no:cacheprovider -ra \
  > "$OUT/gpu_bench_tests.log" 2>&1; tail -15 "$OUT/gpu_bench_tests.log"
timeout 360 python3 benchmarks/lab/cluster_cap_lab.py --out "$OUT" 2>&1 | grep -v "━" \
  | tee "$OUT/cluster_cap_lab.log"
