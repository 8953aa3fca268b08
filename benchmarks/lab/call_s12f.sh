#!/usr/bin/env bash
# Session 12, calls F and G: autonorm's host-inclusive latency in one process, fresh and after
# sweeps (lab/host_after_sweep.py; G adds the enqueue breakdown at rows 8).
set -u
mkdir -p "$OUT"
timeout 200 python3 benchmarks/lab/host_after_sweep.py 2>&1 | grep -v Warning | tee "$OUT/host_after_sweep.log"
