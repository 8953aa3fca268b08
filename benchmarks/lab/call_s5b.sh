#!/usr/bin/env bash
# Session 5, call B: the A/B of call_s5b2.sh (bf16 pairs widened in one instruction each; the
# Welford rebase fp32-only, against main's templates), then the grid re-tune of the shipped DB.
# (As run, call B's A/B failed on a name ab_lab.py had referred to; call B2 re-ran it.)
set -u
mkdir -p "$OUT"
bash "$(dirname "$0")/call_s5b2.sh"
bash benchmarks/gpu_checks.sh grid > /dev/null 2>&1
tail -4 "$OUT/grid.log"
