#!/usr/bin/env bash
# Session 16, call C (~5 min): A/B of guarded one-pass statistics for 16-bit rows (working tree's
# templates) against HEAD's two-pass (benchmarks/lab/templates_base: git archive 4c02b7c templates), the
# same configs, verified, interleaved.
set -u
mkdir -p "$OUT"
L=benchmarks/lab
timeout 330 python3 $L/ab_lab.py --base $L/templates_base --top 2 --rounds 5 --budget-s 300 \
  --out "$OUT/op" \
  --only bfloat16:4096,bfloat16:8192,bfloat16:12288,bfloat16:16384,bfloat16:32768,bfloat16:65536,float16:8192,float16:16384,float16:32768,float16:65536 \
  2>&1 | grep -v "━" | tee "$OUT/ab_op.log" | grep -v "^\s*$" | tail -40
