#!/usr/bin/env bash
# Session 8, call B: A/B of the smem row cache filled by cp.async (templates_cpa) against main's
# templates (templates_base), the shipped DB's smem configs, 16-bit 768-16384 and fp32 4096/8192.
set -u
mkdir -p "$OUT"
only=""
for d in bfloat16 float16; do for h in 768 1024 2048 4096 8192 12288 16384; do only="$only,$d:$h"; done; done
only="${only#,},float32:4096,float32:8192"
timeout 330 python3 benchmarks/lab/ab_lab.py --base benchmarks/lab/templates_base \
  --new benchmarks/lab/templates_cpa --cache smem --top 3 --rounds 4 --budget-s 300 \
  --only "$only" --out "$OUT" 2>&1 | grep -v "━" | tee "$OUT/ab_cpa.log"
