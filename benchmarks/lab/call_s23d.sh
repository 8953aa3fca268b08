#!/usr/bin/env bash
# Session 23, call D: the whole GPU suite and the cold-start tune on the templates (813277effbea)
# and the shipped DB as committed after call C.
set -u
mkdir -p "$OUT"
bash benchmarks/gpu_checks.sh tests
bash benchmarks/gpu_checks.sh tune
