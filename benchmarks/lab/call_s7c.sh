#!/usr/bin/env bash
# Session 7, call C (tuning_db/autonorm.db = call B's grid + buckets): 60 trials on bf16 768
# (call B's grid ran one trial there: the cold compile ate its 10 s) and on the 16-bit shapes
# where capped fwd kernels now meet the bulk kernel, merged into the shipped DB (merge_db's
# 1-point margin), then the full GPU test suite against the merged DB.
set -u
mkdir -p "$OUT"
# As run, these lines spelled the loop out (timeout 130 s a spec; see git history);
# gpu_checks.sh's `search` suite now holds it.
bash benchmarks/gpu_checks.sh search bf16:768,8192,12288,16384 fp16:8192,12288,16384
timeout 260 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider -ra --durations=10 \
  > "$OUT/gpu_tests.log" 2>&1
tail -25 "$OUT/gpu_tests.log"
