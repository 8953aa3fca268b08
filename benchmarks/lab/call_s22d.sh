#!/usr/bin/env bash
# Session 22, call D: 60 trials at fp32 4096 and 32768 (the fp32 shapes behind compile or under
# 95%), merged into the shipped DB with merge_db's 1-point margin, then the full peers run.
set -u
mkdir -p "$OUT"
bash benchmarks/gpu_checks.sh search float32:4096,32768 2>&1 | tail -12
bash benchmarks/gpu_checks.sh peers
