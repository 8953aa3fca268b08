#!/usr/bin/env bash
# Session 5, call C (tuning_db/autonorm.db = call B's grid re-tune): row buckets re-tuned and
# merged into the shipped DB, the full GPU test suite against it, then the full peers run.
set -u
mkdir -p "$OUT"
bash benchmarks/gpu_checks.sh buckets > /dev/null 2>&1
tail -3 "$OUT/buckets.log"
python3 benchmarks/lab/merge_db.py "$OUT/buckets.db" tuning_db/autonorm.db | tail -3
cp tuning_db/autonorm.db "$OUT/shipped.db"
timeout 250 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider -ra --durations=10 \
  > "$OUT/gpu_tests.log" 2>&1
tail -25 "$OUT/gpu_tests.log"
unset AUTONORM_DB
AUTONORM_CACHE_DIR=/tmp/ac_peers timeout 140 python3 benchmarks/peers.py --out "$OUT/peers" \
  --plain --budget-s 120 > "$OUT/peers_full.log" 2>&1
tail -60 "$OUT/peers_full.log"
