#!/usr/bin/env bash
# Session 11, call G: the fwd kernel's persistent grid with rows claimed dynamically
# (fwdd_lab.py; templates_fwdd from tree_patches/templates_fwdd.patch on 2c6e423's templates).
set -u
mkdir -p "$OUT"
timeout 300 python3 benchmarks/lab/fwdd_lab.py --out "$OUT" 2>&1 | grep -v "━" | tee "$OUT/fwdd_lab.log"
