#!/usr/bin/env bash
# Session 19, call b (~4 min): call a's graph_sched_lab with the poison fill moved onto the
# graphs' stream (call a's fill on CuPy's default stream raced with the replay: "same bits
# False" at fp32), then the sweep: static against dynamic at 1-32 tiles a resident cluster.
# Prediction (call a: rows 512 at bf16 16384, ~3.9 tiles a cluster, x0.90; 2^26 elements,
# 15-31 tiles a cluster, x1.02-1.07): the dynamic schedule pays from somewhere near 8 tiles a
# cluster. The schedule GPU tests again with their fills ordered.
set -u
mkdir -p "$OUT"
timeout 120 python3 -m pytest -q -m gpu tests/test_gpu_schedule.py -p no:cacheprovider \
  > "$OUT/gpu_sched.log" 2>&1; tail -3 "$OUT/gpu_sched.log"
timeout 150 python3 benchmarks/lab/graph_sched_lab.py --rounds 15 --out "$OUT" 2>&1 \
  | tee "$OUT/graph_sched_lab.log" | tail -12
timeout 240 python3 benchmarks/lab/graph_sched_lab.py --sweep --rounds 11 --out "$OUT" 2>&1 \
  | tee "$OUT/graph_sched_sweep.log" | tail -40
