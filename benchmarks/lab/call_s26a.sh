#!/usr/bin/env bash
# Written in session 25 to run first in session 26 (NOTES "What the profile says next"). In
# session 24 (NOTES 113) the unclustered bulk kernel came within x0.983-0.992 of the winners at
# fp32 4096 (t128v4r1-s6 x0.989) and 16-bit 8192 (t128v8r1-s4 x0.991-0.992), all without
# keep_x, which since gives the bulk kernel x1.02-1.05 (120). Prediction: their -k forms beat
# those winners by x1.01-1.03, closing fp32 4096 (0.98x torch.compile, issue 4's last shape).
# promote_lab.py, 11 rounds, a 0.5% floor, stored only if ahead in both re-times; then the
# peers on the resulting DB ($OUT/shipped.db: copy it to tuning_db/). ~300 s. Then the GPU
# suite in a call of its own (bash benchmarks/gpu_checks.sh tests, ~270 s). Session 26 added
# two fp32 4096 tiles before running it: t128 s3 and t512 s4.
set -u
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$OUT/smi.txt"
B=bulk-two_pass-c1-p0
timeout 240 python3 benchmarks/lab/promote_lab.py tuning_db/autonorm.db \
  float32:4096=t128v4r1-$B-s6-k,t128v4r1-$B-s4-k,t128v4r1-$B-s3-k,t256v4r1-$B-s6-k,t256v4r1-$B-s4-k,t512v4r1-$B-s4-k \
  float32:8192=t256v4r1-$B-s3-k,t256v4r1-$B-s4-k,t512v4r1-$B-s3-k,t512v4r1-$B-s4-k \
  bfloat16:8192=t128v8r1-$B-s4-k,t128v8r1-$B-s3-k,t256v8r1-$B-s4-k \
  float16:8192=t128v8r1-$B-s4-k,t128v8r1-$B-s3-k,t256v8r1-$B-s4-k \
  bfloat16:4096@4096=t128v8r1-$B-s4-k,t256v8r2-$B-s3-k \
  bfloat16:8192@4096=t128v8r1-$B-s4-k,t256v8r1-$B-s4-k \
  --rounds 11 --min-gain 0.005 --note "bulk keep_x challenger, session 26 call A" 2>&1 \
  | tee "$OUT/promote.log" | grep -v "^$"
cp tuning_db/autonorm.db "$OUT/shipped.db"
bash benchmarks/gpu_checks.sh peers | tail -42
