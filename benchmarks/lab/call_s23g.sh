#!/usr/bin/env bash
# Session 23, call G: head to head at the shapes still behind compile or under 95% in call F's
# peers run: 16-bit 1024 (register and smem configs the 60-trial searches of session 20 left out
# or ranked low) and the LLM shape bf16 4096 rows 4096 (unclustered bulk configs with the fp32
# tile); then the whole GPU suite on the resulting DB ($OUT/shipped.db).
set -u
mkdir -p "$OUT"
B=bulk-two_pass-c1-p0
R=registers-two_pass-c1-p0-m0
timeout 200 python3 benchmarks/lab/promote_lab.py tuning_db/autonorm.db \
  bfloat16:1024=t32v8r1-$R,t64v8r1-$R,t64v8r2-$R,t128v8r1-$R,t128v8r4-smem-two_pass-c1-p0-m64 \
  float16:1024=t32v8r1-$R,t64v8r1-$R,t64v8r2-$R,t128v8r1-$R,t256v8r8-smem-two_pass-c1-p0-m64 \
  bfloat16:4096@4096=t256v8r1-$B-s4,t256v8r1-$B-s6,t256v8r1-$B-s8,t128v8r1-$B-s8,t512v8r1-$B-s4 \
  --rounds 11 2>&1 | tee "$OUT/promote.log"
cp tuning_db/autonorm.db "$OUT/shipped.db"
bash benchmarks/gpu_checks.sh tests | tail -8
