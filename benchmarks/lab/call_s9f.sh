#!/usr/bin/env bash
# Session 9, call F (final templates and shipped DB): the GPU suite, the full peers run, then the
# CLI cold start of the main job.
set -u
mkdir -p "$OUT"
bash benchmarks/gpu_checks.sh tests 2>&1 | tail -6
bash benchmarks/gpu_checks.sh peers
timeout 90 bash benchmarks/gpu_checks.sh tune 2>&1 | tail -8
