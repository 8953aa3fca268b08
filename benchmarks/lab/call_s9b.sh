#!/usr/bin/env bash
# Session 9, call B: rows per block, 1024-thread blocks and clusters at 12288-32768 (16-bit), with
# and without the L1 evict_last weight/bias loads (decompose_lab.py --plan).
set -u
mkdir -p "$OUT"
W=t256v8r1-smem-two_pass-c1-p0-m64
P=""
for s in bfloat16:16384 float16:16384 bfloat16:12288; do
  for v in "$W:base" "$W:evl" "$W:noaff" t512v8r2-smem-two_pass-c1-p0-m64:base \
      t512v8r2-smem-two_pass-c1-p0-m64:evl t1024v8r4-smem-two_pass-c1-p0:base \
      t1024v8r4-smem-two_pass-c1-p0:evl t1024v8r2-smem-two_pass-c1-p0:base \
      t512v8r1-smem-two_pass-c2-p0:base t256v8r1-smem-two_pass-c4-p0:base \
      t512v8r1-registers-two_pass-c2-p0:base; do
    P="$P,$s:$v"
  done
done
for v in t512v8r1-bulk-two_pass-c1-p0-s2:base t512v8r1-smem-two_pass-c1-p0-m64:base \
    t512v8r1-smem-two_pass-c1-p0-m64:evl t512v8r1-smem-two_pass-c1-p0-m64:noaff \
    t512v8r1-smem-two_pass-c2-p0:base t1024v8r1-smem-two_pass-c2-p0:base \
    t256v8r1-smem-two_pass-c4-p0:base t1024v8r2-smem-two_pass-c1-p0:base; do
  P="$P,bfloat16:32768:$v"
done
timeout 480 python3 benchmarks/lab/decompose_lab.py --plan "${P#,}" --out "$OUT" 2>&1 \
  | grep -v "━" | tee "$OUT/decompose_lab_b.log"
