#!/usr/bin/env bash
# Session 21, call G: with the one-warp-row seed (space.seed_configs), 60 trials at fp32 768 and
# 1024 merged into the shipped DB (merge_db's 1-point margin), then the full peers run on it.
set -u
mkdir -p "$OUT"
bash benchmarks/gpu_checks.sh search float32:768,1024 2>&1 | tail -12
bash benchmarks/gpu_checks.sh peers
