#!/usr/bin/env bash
# Session 6, call D (final shipped DB = call B's grid + buckets; the fp32 Welford run cap):
# the GPU fuzz and space tests again, the CLI cold start, the full peers run, then ncu of our
# winner next to torch.compile at bf16 768 / 8192 and fp32 8192 (stall reasons, for what next).
set -u
mkdir -p "$OUT"
timeout 90 python3 -m pytest -q -m gpu tests/test_fuzz.py tests/test_space.py -p no:cacheprovider \
  -ra > "$OUT/gpu_tests_fuzz.log" 2>&1; tail -3 "$OUT/gpu_tests_fuzz.log"
bash benchmarks/gpu_checks.sh tune 2>&1 | tail -12
AUTONORM_CACHE_DIR=/tmp/ac_peers timeout 150 python3 benchmarks/peers.py --out "$OUT/peers" \
  --plain --budget-s 130 > "$OUT/peers_full.log" 2>&1
tail -60 "$OUT/peers_full.log"
# As run, these lines spelled the ncu command out (5 sections; see git history); gpu_checks.sh's
# `ncu` suite now holds it.
bash benchmarks/gpu_checks.sh ncu bfloat16:768 bfloat16:8192 float32:8192
