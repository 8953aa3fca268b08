#!/usr/bin/env bash
# Session 9, call E: A/B of the fully unrolled store pass (codegen.unrolls_store) against the
# templates of HEAD (templates_base), then the re-tune of the shipped DB for the new templates.
set -u
mkdir -p "$OUT"
timeout 140 python3 benchmarks/lab/ab_lab.py --base benchmarks/lab/templates_base --cache smem \
  --top 3 --rounds 5 --budget-s 110 \
  --only bfloat16:16384,float16:16384,bfloat16:12288,float16:12288,bfloat16:8192 \
  --out "$OUT" 2>&1 | grep -v "━" | tee "$OUT/ab_unroll.log"
bash benchmarks/gpu_checks.sh ship 2>&1 | grep -v "━" | tail -30
