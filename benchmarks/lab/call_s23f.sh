#!/usr/bin/env bash
# Session 23, call F: the unclustered bulk configs (plain stores since NOTES 106) head to head
# with the shipped smem winners at 16-bit 12288 and at bf16 8192 rows 4096 (peers' LLM shape),
# where no search has timed them since 106 (promote_lab.py, 15 rounds, confirmed once more);
# then the full peers run on the resulting DB ($OUT/shipped.db).
set -u
mkdir -p "$OUT"
B=bulk-two_pass-c1-p0
timeout 300 python3 benchmarks/lab/promote_lab.py tuning_db/autonorm.db \
  bfloat16:12288=t256v8r1-$B-s3,t256v8r1-$B-s4,t256v8r1-$B-s2,t512v8r1-$B-s2,t512v8r1-$B-s3 \
  float16:12288=t256v8r1-$B-s3,t256v8r1-$B-s4,t256v8r1-$B-s2,t512v8r1-$B-s2,t512v8r1-$B-s3 \
  bfloat16:8192@4096=t256v8r1-$B-s3,t256v8r1-$B-s4,t128v8r1-$B-s4,t512v8r1-$B-s4,t256v8r1-$B-s6 \
  --rounds 15 2>&1 | tee "$OUT/promote.log"
cp tuning_db/autonorm.db "$OUT/shipped.db"
bash benchmarks/gpu_checks.sh peers | tail -42
