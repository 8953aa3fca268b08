#!/usr/bin/env bash
set -u
export PYTHONUNBUFFERED=1 AUTONORM_CACHE_DIR=/tmp/ac CUPY_CACHE_DIR=/tmp/cc
OUT=${OUT:-/tmp/out}
cd benchmarks/lab && (time JOBS=32 python3 build_lab.py rc_sel.json) 2>&1 | tail -4 && cd ../..
timeout 400 python3 benchmarks/lab/bulk_lab.py --out $OUT --budget-s 380 > $OUT/bulk_lab3.log 2>&1
grep -E "BEST|shipped|^copy|Error|error|budget" $OUT/bulk_lab3.log | head -60
