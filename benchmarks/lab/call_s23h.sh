#!/usr/bin/env bash
# Session 23, call H: the full peers run on the final shipped DB (after call G, fp16 1024's
# noise-level promotion put back).
set -u
mkdir -p "$OUT"
bash benchmarks/gpu_checks.sh peers | tail -42
