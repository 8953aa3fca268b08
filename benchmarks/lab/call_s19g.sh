#!/usr/bin/env bash
# Session 19, call g (~3 min): the bulk kernel counting out at its first failed claim instead
# of at exit (tree_patches/s19_claim_exit.patch, applied in the working tree by `git apply`;
# NOTES.md 93: x0.997-1.010 at 1-4 tiles a cluster, not landed this session): the schedule GPU
# tests, then graph_sched_lab's sweep at two of call b's configs. Prediction (92: the counter
# costs ~1 us a launch, the exit's fence -> count-out -> zeroing chain): dynamic against static
# at 1 tile a cluster from x0.87 to x0.95 or better, at 16 tiles x1.03-1.04 as before.
set -u
mkdir -p "$OUT"
timeout 100 python3 -m pytest -q -m gpu tests/test_gpu_schedule.py -p no:cacheprovider \
  > "$OUT/gpu_sched_exit.log" 2>&1; tail -2 "$OUT/gpu_sched_exit.log"
timeout 100 python3 benchmarks/lab/graph_sched_lab.py --sweep --rounds 9 --tiles 1,2,4,8,16 \
  --only bfloat16:16384,float32:65536 --out "$OUT" 2>&1 | tee "$OUT/graph_sched_exit.log" | tail -12
