#!/usr/bin/env bash
# Session 10, call E (final templates and shipped DB): the GPU suite, the full peers run, then the
# CLI cold start of the main job.
set -u
mkdir -p "$OUT"
bash benchmarks/gpu_checks.sh tests 2>&1 | tail -6
AUTONORM_CACHE_DIR=/tmp/ac_peers timeout 270 python3 benchmarks/peers.py --out "$OUT/peers" \
  --plain --budget-s 240 > "$OUT/peers_full.log" 2>&1
tail -75 "$OUT/peers_full.log"
timeout 90 bash benchmarks/gpu_checks.sh tune 2>&1 | tail -8
