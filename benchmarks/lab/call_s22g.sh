#!/usr/bin/env bash
# Session 22, call G: plain y stores in unclustered bulk kernels (templates/ after NOTES 106).
# carry_db.py re-keyed the 41 shipped winners whose kernels did not change; this tunes the shapes
# whose c1 bulk winners changed and the shapes where c1 bulk came close in plain_lab (60 trials,
# merged with merge_db's 1-point margin), and the rows-512 bucket at 16-bit 16384.
set -u
mkdir -p "$OUT"
bash benchmarks/gpu_checks.sh search float32:12288,16384 bfloat16:16384,32768 \
  float16:16384,32768 2>&1 | tail -16
AUTONORM_DB=$OUT/b512.db timeout 110 python3 benchmarks/tune_grid.py --dtypes bf16,fp16 \
  --hidden 16384 --rows 512 --trials 30 --timeout 12 2>&1 | grep -v "━" | grep -v "^\s*$" \
  | tee "$OUT/b512.log" | tail -4
python3 benchmarks/lab/merge_db.py "$OUT/b512.db" tuning_db/autonorm.db | tee -a "$OUT/merge.log"
cp tuning_db/autonorm.db "$OUT/shipped.db"
