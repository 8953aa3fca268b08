#!/usr/bin/env bash
# Session 19, call d (~8 min): the export GPU test with rows enough for the 8-tile rule (call c's
# one failure: its dirty-workspace check ran at 300 rows, under the rule), graph_sched_lab's bit
# checks at fp32 with the sets' zeroing waited for and each graph against a plain launch, then
# the full peers run and the CLI cold start on the product at this commit.
set -u
mkdir -p "$OUT"
timeout 150 python3 -m pytest -q -m gpu tests/test_export.py tests/test_gpu_schedule.py \
  -p no:cacheprovider > "$OUT/gpu_export_sched.log" 2>&1; tail -3 "$OUT/gpu_export_sched.log"
timeout 100 python3 benchmarks/lab/graph_sched_lab.py --rounds 5 --out "$OUT" \
  --only float32:12288,float32:16384,float32:32768,bfloat16:16384 2>&1 \
  | tee "$OUT/graph_sched_bits.log" | tail -5
bash benchmarks/gpu_checks.sh peers
timeout 90 bash benchmarks/gpu_checks.sh tune 2>&1 | tail -8
