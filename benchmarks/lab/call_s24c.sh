#!/usr/bin/env bash
# Session 24, call C: head to head (promote_lab.py, 15 rounds, the 0.3% floor) at the shapes
# still behind the best peer and the rows-512 buckets:
# - fp32 4096 (0.98x torch.compile) and 16-bit 1024 (0.99-0.995x): torch.compile's kernel there
#   reads the row twice (Welford, then the row again from L2; NOTES 100), which is our uncached
#   kernel (cache none, Welford statistics). The grid searches timed it once at fp32 4096 (t128
#   r2, 84.7%), never at 512 threads, never at 16-bit 1024.
# - 16384 rows 512: clustered tiles of 8-16 KB (rows 1-8 took c8, call B; rows 64 kept c1).
set -u
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$OUT/smi.txt"
N=none-welford-c1
W=bulk-two_pass
F4="t512v4r1-$N-p0,t256v4r1-$N-p0,t1024v4r1-$N-p0,t512v2r1-$N-p0,t256v4r2-$N-p0"
F4="$F4,t128v4r4-$N-p0,t512v4r1-$N-p4,t512v4r1-$N-p8"
H1="t32v8r1-$N-p0,t32v8r1-$N-p0-m64,t64v8r1-$N-p0,t128v8r1-$N-p0,t128v8r4-$N-p0"
H1="$H1,t256v8r8-$N-p0,t32v8r1-$N-p4"
R8="t256v8r1-$W-c2-p0-s1,t256v8r1-$W-c2-p0-s2,t128v8r1-$W-c4-p0-s1,t128v8r1-$W-c4-p0-s2"
R8="$R8,t256v8r1-$W-c4-p0-s2"
R4="t256v4r1-$W-c2-p0-s1,t128v4r1-$W-c4-p0-s1,t128v4r1-$W-c4-p0-s2,t256v4r1-$W-c4-p0-s2"
timeout 400 python3 benchmarks/lab/promote_lab.py tuning_db/autonorm.db \
  float32:4096=$F4 bfloat16:1024=$H1 float16:1024=$H1 \
  bfloat16:16384@512=$R8 float16:16384@512=$R8 float32:16384@512=$R4 \
  --rounds 15 --note "session 24 call C" 2>&1 | tee "$OUT/promote.log"
cp tuning_db/autonorm.db "$OUT/shipped.db"
