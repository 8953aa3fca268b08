#!/usr/bin/env bash
# Session 23, call I (measurement only, nothing stored: --min-gain 1 on a copy of the DB): the
# unclustered bulk configs against the shipped winners at bf16 8192 (rows 8192) and fp32 4096
# (rows 16384, 0.98x compile), shapes no search has revisited since NOTES 106.
set -u
mkdir -p "$OUT"
cp tuning_db/autonorm.db /tmp/measure_only.db
B=bulk-two_pass-c1-p0
timeout 200 python3 benchmarks/lab/promote_lab.py /tmp/measure_only.db \
  bfloat16:8192=t256v8r1-$B-s3,t256v8r1-$B-s4,t256v8r1-$B-s6,t128v8r1-$B-s4,t128v8r1-$B-s6,t512v8r1-$B-s3 \
  float32:4096=t256v4r1-$B-s4,t256v4r1-$B-s6,t512v4r1-$B-s4,t128v4r1-$B-s6 \
  --rounds 9 --min-gain 1 2>&1 | tee "$OUT/measure.log"
