#!/usr/bin/env bash
# Written in session 24 to run first in session 25 (NOTES "What the profile says next"): every
# shipped bulk winner against its keep_x twin (promote_lab.py --keep-x-twins, 21 shapes, 11
# rounds, a 0.5% floor, each stored only if ahead in both re-times), then the whole GPU suite
# and the full peers run on the resulting DB ($OUT/shipped.db: copy it to tuning_db/). ~460 s.
set -u
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$OUT/smi.txt"
cp tuning_db/autonorm.db "$OUT/before.db"
timeout 150 python3 benchmarks/lab/promote_lab.py tuning_db/autonorm.db --keep-x-twins \
  --rounds 11 --min-gain 0.005 --note "keep_x twin, session 25 call A" 2>&1 | tee "$OUT/promote.log"
cp tuning_db/autonorm.db "$OUT/shipped.db"
bash benchmarks/gpu_checks.sh tests | tail -8
bash benchmarks/gpu_checks.sh peers | tail -42
