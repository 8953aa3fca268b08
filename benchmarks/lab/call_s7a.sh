#!/usr/bin/env bash
# Session 7, call A: A/B of the 64-register cap for 16-bit fwd kernels (NOTES 33) on the shipped
# DB's top configs of the 16-bit shapes that trail a peer or sit under 90% of copy.
set -u
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
python3 benchmarks/lab/ab_lab.py --base benchmarks/lab/templates_base \
  --new benchmarks/lab/templates_cap \
  --only bfloat16:768,bfloat16:1024,bfloat16:2048,bfloat16:4096,bfloat16:8192,float16:768,float16:1024,float16:8192 \
  --top 6 --rounds 5 --budget-s 330 --out "$OUT" 2>&1 | tee "$OUT/ab_regcap.log" | grep -v "━"
