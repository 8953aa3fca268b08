#!/usr/bin/env bash
# Session 5, call F (branch wip/pair-sums, lab only): 16-bit pass 1 sums each vector as a
# balanced tree and shifts it once; held rows keep x - centre from pass 2 for normalization.
# Same-run A/B against main's templates.
set -u
mkdir -p "$OUT"
timeout 200 python3 benchmarks/lab/ab_lab.py --base benchmarks/lab/templates_base \
  --only bfloat16:768,bfloat16:1024,bfloat16:4096,bfloat16:8192,bfloat16:16384,bfloat16:65536,float16:768,float16:8192,float16:16384 \
  --top 3 --rounds 5 --budget-s 170 --out "$OUT/ab_pairsum" > "$OUT/ab_pairsum.log" 2>&1
grep -v "^\s*$" "$OUT/ab_pairsum.log" | cut -c1-150
