#!/usr/bin/env bash
# Session 8, call E (final templates 957b472d57d9 and shipped DB): the full peers run under the
# new protocol (read flush primary, zeroing flush beside it, copy of the same bytes), then the
# CLI cold start of the main job.
set -u
mkdir -p "$OUT"
AUTONORM_CACHE_DIR=/tmp/ac_peers timeout 330 python3 benchmarks/peers.py --out "$OUT/peers" \
  --plain --budget-s 300 > "$OUT/peers_full.log" 2>&1
tail -75 "$OUT/peers_full.log"
timeout 100 bash benchmarks/gpu_checks.sh tune 2>&1 | tail -8
