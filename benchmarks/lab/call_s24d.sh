#!/usr/bin/env bash
# Session 24, call D:
# 1. Bulk tiles of 16 vectors a thread, outside the product's space (BULK_MAX_ITERS 8; nvcc
#    13.0 compiles bf16 32768 t256 c1 s1 at 128 registers without spills): two 256-thread
#    blocks an SM on a 64 KB row (16-bit 32768, fp32 16384), or three 128-thread blocks on a
#    32 KB tile (bf16 16384 s2, bf16 65536 c4 s2), where the winners hold one 512-thread
#    block or two 256-thread ones. 16-bit 16384 rows stream at 97.5-97.9% of copy with two
#    blocks an SM, 32768 at 95.6-95.8% with one (NOTES 95). Dry run, 15 rounds: nothing stored.
# 2. The latency seeds (f7d2225) through the tuner itself: tune_grid at 16384 rows 1 and 8
#    (the buckets' settings in gpu_checks.sh) into a scratch DB; does the search pick c8?
set -u
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$OUT/smi.txt"
W=bulk-two_pass
timeout 330 python3 benchmarks/lab/promote_lab.py tuning_db/autonorm.db --bulk-max-iters 16 \
  bfloat16:32768=t256v8r1-$W-c1-p0-s1 float16:32768=t256v8r1-$W-c1-p0-s1 \
  bfloat16:65536=t256v8r1-$W-c2-p0-s1,t128v8r1-$W-c4-p0-s2,t128v8r1-$W-c4-p0-s3 \
  float16:65536=t256v8r1-$W-c2-p0-s1,t128v8r1-$W-c4-p0-s2,t128v8r1-$W-c4-p0-s3 \
  bfloat16:16384=t128v8r1-$W-c1-p0-s2,t128v8r1-$W-c1-p0-s3 \
  float32:16384=t256v4r1-$W-c1-p0-s1 \
  float32:32768=t256v4r1-$W-c2-p0-s1 float32:65536=t256v4r1-$W-c4-p0-s1 \
  --rounds 15 2>&1 | tee "$OUT/iters16.log"
AUTONORM_DB=$OUT/latency.db timeout 90 python3 benchmarks/tune_grid.py --dtypes bf16,fp16,fp32 \
  --hidden 16384 --rows 1,8 --trials 10 --timeout 3 2>&1 | grep -v "^\s*$" | grep -v "━" \
  | tee "$OUT/latency_tune.log"
