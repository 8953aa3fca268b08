#!/usr/bin/env bash
# Session 4, call E: a longer search (60 trials) on the shapes where autonorm trails a peer, the
# better winners merged into a copy of the shipped DB, then the peers on those shapes with it.
set -u
mkdir -p "$OUT"
export AUTONORM_DB=$OUT/long.db
for spec in bf16:768,1024,16384 fp16:768,1024,8192,16384 fp32:768,4096,12288; do
  timeout 120 python3 benchmarks/tune_grid.py --dtypes "${spec%%:*}" --hidden "${spec#*:}" \
    --trials 60 --timeout 25 2>&1 | grep -v "^\s*$" | tee -a "$OUT/long.log" | tail -4
done
cp tuning_db/autonorm.db "$OUT/merged.db"
python3 benchmarks/lab/merge_db.py "$OUT/long.db" "$OUT/merged.db" | tee "$OUT/merge.log"
unset AUTONORM_DB  # dispatch from the merged DB alone: an empty user cache
AUTONORM_CACHE_DIR=/tmp/ac_peers AUTONORM_SHIPPED_DB=$OUT/merged.db timeout 100 python3 benchmarks/peers.py --suites sweep \
  --hidden 768,1024,4096,8192,12288,16384 --out "$OUT/peers" --plain --budget-s 90 \
  > "$OUT/peers_subset.log" 2>&1
tail -22 "$OUT/peers_subset.log"
