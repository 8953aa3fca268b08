#!/usr/bin/env bash
# Session 24, call E: the whole GPU suite on the committed tree and shipped DB (5 latency
# winners from call B); the bucket search at 16384 rows 1 and 8 with the seeds reordered
# (does the tuner itself now find c8?), into a scratch DB; the full peers run.
set -u
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$OUT/smi.txt"
bash benchmarks/gpu_checks.sh tests | tail -12
AUTONORM_DB=$OUT/latency.db timeout 90 python3 benchmarks/tune_grid.py --dtypes bf16,fp16,fp32 \
  --hidden 16384 --rows 1,8 --trials 10 --timeout 3 2>&1 | grep -v "^\s*$" | grep -v "━" \
  | tee "$OUT/latency_tune.log"
bash benchmarks/gpu_checks.sh peers | tail -42
