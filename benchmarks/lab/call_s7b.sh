#!/usr/bin/env bash
# Session 7, call B (max_regs in the space, 16-bit capped seeds): re-tune the shipped DB, the grid
# (24 trials a shape) and the row buckets, merged into $OUT/shipped.db. As run it was
# call_s6b.sh's lines (templates printed, grid, buckets, merge); gpu_checks.sh's `ship` suite now
# holds them.
set -u
python3 -c "from autonorm import codegen; print('templates', codegen.code_version())"
bash benchmarks/gpu_checks.sh ship 2>&1 | grep -v "━"
