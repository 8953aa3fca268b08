#!/usr/bin/env bash
# Session 22, call E: the GPU suite on main as it stands (the seed refactor 8e7d763 had not run on
# a GPU), then the CLI cold start of the main job.
set -u
mkdir -p "$OUT"
bash benchmarks/gpu_checks.sh tests 2>&1 | tail -6
timeout 90 bash benchmarks/gpu_checks.sh tune 2>&1 | tail -8
