#!/usr/bin/env bash
# Session 15, call B (~470 s): the re-tune the bulk template's cleanup needs (gpu_checks.sh ship),
# then 60 trials on bf16 1024 and 16384 (trailing the best peer by 1-2% in session 14's peers
# run) merged into the new DB with merge_db's 1-point margin. $OUT/shipped.db is the result.
set -u
mkdir -p "$OUT"
bash benchmarks/gpu_checks.sh ship
cp "$OUT/shipped.db" tuning_db/autonorm.db
bash benchmarks/gpu_checks.sh search bf16:1024,16384
