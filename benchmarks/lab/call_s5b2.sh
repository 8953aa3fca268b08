#!/usr/bin/env bash
# Session 5, call B2: call B's A/B again (ab_lab had referred to a reverted name).
set -u
mkdir -p "$OUT"
timeout 200 python3 benchmarks/lab/ab_lab.py --base benchmarks/lab/templates_base \
  --only bfloat16:768,bfloat16:1024,bfloat16:2048,bfloat16:4096,bfloat16:8192,bfloat16:12288,bfloat16:16384,bfloat16:32768,bfloat16:65536,float16:1024 \
  --top 3 --rounds 5 --budget-s 180 --out "$OUT/ab_elem" > "$OUT/ab_elem.log" 2>&1
grep "SHAPE\|FAIL\|budget\|Error" "$OUT/ab_elem.log"
timeout 50 python3 benchmarks/lab/ab_lab.py --base benchmarks/lab/templates_base --stats welford \
  --only bfloat16:4096,float32:1024 --top 2 --rounds 4 --budget-s 40 \
  --out "$OUT/ab_welford" > "$OUT/ab_welford.log" 2>&1
grep -v "^\s*$" "$OUT/ab_welford.log" | tail -6
