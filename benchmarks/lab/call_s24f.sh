#!/usr/bin/env bash
# Session 24, call F: call E's bucket search resumed call D's studies (the warm machine kept
# /tmp/ac/studies), so it measured nothing new. Again with a fresh cache and studies: the bucket
# search at 16384 rows 1 and 8 as gpu_checks.sh runs it (10 trials, 3 s), the latency seeds now
# right after the default. Does the tuner itself take c8 where promote_lab did (call B)?
set -u
mkdir -p "$OUT"
export AUTONORM_CACHE_DIR=/tmp/ac_fresh_$$
AUTONORM_DB=$OUT/latency.db timeout 120 python3 benchmarks/tune_grid.py --dtypes bf16,fp16,fp32 \
  --hidden 16384 --rows 1,8 --trials 10 --timeout 3 2>&1 | grep -v "^\s*$" | grep -v "━" \
  | tee "$OUT/latency_tune.log"
python3 - "$OUT/latency.db" <<'PY' | tee "$OUT/latency_trials.txt"
import sqlite3, sys
con = sqlite3.connect(sys.argv[1])
for r in con.execute("select dtype, rows_bucket, trial_number, label, status, round(median_us, 2)"
                     " from trials order by dtype, rows_bucket, trial_number"):
    print(*r)
PY
