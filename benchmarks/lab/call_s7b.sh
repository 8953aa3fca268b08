#!/usr/bin/env bash
# Session 7, call B (max_regs in the space, 16-bit capped seeds): re-tune the shipped DB,
# the grid (24 trials a shape) and the row buckets, merged into $OUT/shipped.db.
set -u
mkdir -p "$OUT"
python3 -c "from autonorm import codegen; print('templates', codegen.code_version())"
bash benchmarks/gpu_checks.sh grid > /dev/null 2>&1
cat "$OUT/grid.log" | grep -v "━"
bash benchmarks/gpu_checks.sh buckets > /dev/null 2>&1
grep -v "━" "$OUT/buckets.log" | tail -20
cp "$OUT/ship.db" "$OUT/shipped.db"
python3 benchmarks/lab/merge_db.py "$OUT/buckets.db" "$OUT/shipped.db" | tail -3
