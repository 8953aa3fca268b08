#!/usr/bin/env bash
# Prepared in session 12 for the next session: the packed 16-bit tile in registers
# (t16_lab.py; build benchmarks/lab/templates_t16 first, tree_patches/README.md), then the
# driver's own launch cost against autonorm's raw launch (host_launch_probe.py).
set -u
mkdir -p "$OUT"
timeout 300 python3 benchmarks/lab/t16_lab.py --rounds 5 --out "$OUT" 2>&1 | grep -v "━" \
  | tee "$OUT/t16_lab.log" | tail -30
timeout 120 python3 benchmarks/lab/host_launch_probe.py 2>&1 | grep -v Warning \
  | tee "$OUT/host_launch_probe.log" | tail -5
