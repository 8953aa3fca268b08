#!/usr/bin/env bash
# Session 5, call D: a longer search (60 trials) on the shapes that trail a peer after call C,
# merged into a copy of the shipped DB (merge_db's 1-point margin), then the peers on them.
set -u
mkdir -p "$OUT"
export AUTONORM_DB=$OUT/long.db
for spec in bf16:768,1024,16384 fp16:768,8192,16384; do
  timeout 110 python3 benchmarks/tune_grid.py --dtypes "${spec%%:*}" --hidden "${spec#*:}" \
    --trials 60 --timeout 25 2>&1 | grep -v "^\s*$" | tee -a "$OUT/long.log" | tail -4
done
cp tuning_db/autonorm.db "$OUT/merged.db"
python3 benchmarks/lab/merge_db.py "$OUT/long.db" "$OUT/merged.db" | tee "$OUT/merge.log"
unset AUTONORM_DB
AUTONORM_CACHE_DIR=/tmp/ac_peers AUTONORM_SHIPPED_DB=$OUT/merged.db timeout 100 python3 benchmarks/peers.py --suites sweep \
  --hidden 768,1024,8192,16384 --dtypes bf16,fp16 --out "$OUT/peers" --plain --budget-s 90 \
  > "$OUT/peers_subset.log" 2>&1
tail -14 "$OUT/peers_subset.log"
