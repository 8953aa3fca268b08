#!/usr/bin/env bash
# Session 6, call C (tuning_db/autonorm.db = call B's grid + buckets): 60 trials on the shapes
# that trailed a peer in session 5, merged into the shipped DB (merge_db's 1-point margin), then
# the full GPU test suite against the merged DB.
set -u
mkdir -p "$OUT"
# As run, these lines spelled the loop out (timeout 100 s a spec; see git history);
# gpu_checks.sh's `search` suite now holds it.
bash benchmarks/gpu_checks.sh search bf16:768,1024,16384 fp16:768,1024,8192 fp32:768,1024,16384
timeout 250 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider -ra --durations=10 \
  > "$OUT/gpu_tests.log" 2>&1
tail -25 "$OUT/gpu_tests.log"
