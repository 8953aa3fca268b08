#!/usr/bin/env bash
# Prepared in session 15 for the next session's first call (~8 min): NOTES.md 77's change
# (weights in registers decided at the blocks reached, t256 clustered seeds) ran only the bulk
# kernel's 27 GPU tests, and its DB no peers run. The whole GPU suite, then the peers' full grid.
# Then a full re-tune (gpu_checks.sh ship, ~390 s, its own call) so every shape's search sees
# the 1,203 bulk configs that now hold their weights in registers; keep a winner only where
# merge_db's 1-point margin says so.
set -u
mkdir -p "$OUT"
bash benchmarks/gpu_checks.sh tests 2>&1 | tail -6
AUTONORM_CACHE_DIR=/tmp/ac_peers timeout 270 python3 benchmarks/peers.py --out "$OUT/peers" \
  --plain --budget-s 240 > "$OUT/peers_full.log" 2>&1
tail -75 "$OUT/peers_full.log"
