#!/usr/bin/env bash
# Session 23, call E: the full peers run on the committed templates and shipped DB (after C).
set -u
mkdir -p "$OUT"
bash benchmarks/gpu_checks.sh peers
