#!/usr/bin/env bash
# Session 25, call C: keep_x now reaches the fwd kernel (call B: x1.02-1.03 at the 16-bit 1024
# and bf16 4096 winners, x1.01 at 768). Every shipped winner of the fwd kernel against its -k
# twin (promote_lab.py --keep-x-twins --twin-caches registers,smem,none, 11 rounds, a 0.5%
# floor, stored only if ahead in both re-times), then the whole GPU suite (the fwd keep_x
# same-bits tests, AUTONORM_NO_KEEP_X) and the peers on the resulting DB ($OUT/shipped.db).
set -u
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$OUT/smi.txt"
timeout 200 python3 benchmarks/lab/promote_lab.py tuning_db/autonorm.db --keep-x-twins \
  --twin-caches registers,smem,none --rounds 11 --min-gain 0.005 \
  --note "keep_x twin, session 25 call C" 2>&1 | tee "$OUT/promote.log" | grep -v "^$" | tail -60
cp tuning_db/autonorm.db "$OUT/shipped.db"
bash benchmarks/gpu_checks.sh tests | tail -8
bash benchmarks/gpu_checks.sh peers | tail -42
