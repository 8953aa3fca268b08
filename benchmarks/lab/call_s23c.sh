#!/usr/bin/env bash
# Session 23, call C: the bulk kernel's grid cut to the balanced count (grid_lab.py, 9 rounds),
# then the three winners session 22's merge kept by its margin, settled head to head with the
# tuner's finals (promote_lab.py, 15 rounds) in the shipped DB ($OUT/shipped.db).
set -u
mkdir -p "$OUT"
timeout 330 python3 benchmarks/lab/grid_lab.py --out "$OUT" --rounds 9 2>&1 | tee "$OUT/grid_lab.log" | grep -v "^$"
cp tuning_db/autonorm.db "$OUT/before.db"
timeout 200 python3 benchmarks/lab/promote_lab.py tuning_db/autonorm.db \
  float16:32768=t512v8r1-bulk-two_pass-c1-p0-s2 \
  float16:16384=t256v8r1-bulk-two_pass-c1-p0-s3 \
  bfloat16:16384=t256v8r1-bulk-two_pass-c1-p0-s3 --rounds 15 2>&1 | tee "$OUT/promote.log"
cp tuning_db/autonorm.db "$OUT/shipped.db"
