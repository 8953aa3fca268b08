#!/usr/bin/env bash
# Session 7, call D (final shipped DB = call B's grid + buckets + call C's merge): the GPU tests
# that call C's time limit cut off (from the Welford outlier tests on, with the two configs the
# session 6 run cap had made invalid replaced), the CLI cold start, then the full peers run.
set -u
mkdir -p "$OUT"
timeout 240 python3 -m pytest -v -m gpu -p no:cacheprovider -ra --durations=8 \
  tests/test_gpu_kernels.py::test_welford_follows_its_mean_under_an_outlier_shift \
  tests/test_gpu_traffic.py tests/test_isolation.py tests/test_torch.py \
  > "$OUT/gpu_tests_rest.log" 2>&1
grep -E "PASSED|FAILED|ERROR|SKIPPED" "$OUT/gpu_tests_rest.log" | grep -c PASSED
grep -E "FAILED|ERROR|passed|failed" "$OUT/gpu_tests_rest.log" | tail -8
timeout 100 bash benchmarks/gpu_checks.sh tune 2>&1 | tail -8
AUTONORM_CACHE_DIR=/tmp/ac_peers timeout 170 python3 benchmarks/peers.py --out "$OUT/peers" \
  --plain --budget-s 140 > "$OUT/peers_full.log" 2>&1
tail -60 "$OUT/peers_full.log"
