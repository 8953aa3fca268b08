#!/usr/bin/env bash
# Session 24, call A: the unclustered bulk kernel (plain stores since NOTES 106) head to head with
# the shipped winners at shapes no search has timed it against since 106 (NOTES "next"): 16-bit
# 8192 rows 8192, fp32 4096 (0.98x compile), fp16 8192 rows 4096 (peers' LLM shape), the rows-512
# buckets at 16384, and fp32 32768 (94% of copy) with other cluster tiles. promote_lab.py, 11
# rounds, confirmed once more; the resulting DB comes back as $OUT/shipped.db.
set -u
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$OUT/smi.txt"
cp tuning_db/autonorm.db "$OUT/before.db"
B=bulk-two_pass-c1-p0
W=bulk-two_pass
E8="t256v8r1-$B-s3,t256v8r1-$B-s4,t256v8r1-$B-s6,t128v8r1-$B-s3,t128v8r1-$B-s4,t128v8r1-$B-s6"
E8="$E8,t128v8r1-$B-s8,t512v8r1-$B-s3"
timeout 540 python3 benchmarks/lab/promote_lab.py tuning_db/autonorm.db \
  bfloat16:8192=$E8 \
  float16:8192=$E8 \
  float32:4096=t256v4r1-$B-s3,t256v4r1-$B-s4,t256v4r1-$B-s6,t256v4r1-$B-s8,t512v4r1-$B-s4,t128v4r1-$B-s6,t128v4r1-$B-s8 \
  float16:8192@4096=t128v8r1-$B-s4,t256v8r1-$B-s4,t128v8r1-$B-s6 \
  float32:32768=t512v4r1-$W-c2-p0-s2,t512v4r1-$W-c4-p0-s3,t256v4r1-$W-c4-p0-s4 \
  bfloat16:16384@512=t256v8r1-$B-s2,t256v8r1-$B-s4,t512v8r1-$B-s2 \
  float16:16384@512=t256v8r1-$B-s2,t256v8r1-$B-s4,t512v8r1-$B-s2 \
  float32:16384@512=t512v4r1-$B-s2,t256v4r1-$W-c2-p0-s3 \
  --rounds 11 --note "session 24 call A" 2>&1 | tee "$OUT/promote.log"
cp tuning_db/autonorm.db "$OUT/shipped.db"
