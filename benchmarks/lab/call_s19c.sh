#!/usr/bin/env bash
# Session 19, call c (~5 min): graph_sched_lab at the four fp32 shapes and bf16 32768 with its
# poison, replay and copy all on one stream (calls a and b read "same bits False" at the largest
# buffers: their copies ran on CuPy's default stream, unordered with the replays); then the
# whole GPU suite on a54a730's product (tile counters for captured launches, the 8-tile rule).
set -u
mkdir -p "$OUT"
timeout 120 python3 benchmarks/lab/graph_sched_lab.py --rounds 7 --out "$OUT" \
  --only float32:12288,float32:16384,float32:32768,float32:65536,bfloat16:32768 2>&1 \
  | tee "$OUT/graph_sched_bits.log" | tail -6
bash benchmarks/gpu_checks.sh tests 2>&1 | tail -25
