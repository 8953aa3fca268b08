#!/usr/bin/env bash
# Session 22, call H: the GPU suite and the cold start on 106's templates and re-tuned DB.
set -u
mkdir -p "$OUT"
bash benchmarks/gpu_checks.sh tests 2>&1 | tail -5
timeout 70 bash benchmarks/gpu_checks.sh tune 2>&1 | tail -3
