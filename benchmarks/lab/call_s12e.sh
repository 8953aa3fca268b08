#!/usr/bin/env bash
# Session 12, call E: the full peers run (final templates and DB), with peers.py changed to run
# its latency suite last (RUN_ORDER llm, sweep, latency); falsified (NOTES.md 62) and reverted.
set -u
mkdir -p "$OUT"
AUTONORM_CACHE_DIR=/tmp/ac_peers timeout 300 python3 benchmarks/peers.py --out "$OUT/peers" \
  --plain --budget-s 260 > "$OUT/peers_full.log" 2>&1
tail -75 "$OUT/peers_full.log"
