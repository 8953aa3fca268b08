#!/usr/bin/env bash
# Session 15, call D (~2 min): NOTES next (c)/(d): which part of a clustered bulk kernel's tile is
# the exchange. Timelines (lab/timeline_lab.py, exchange stamps added) of bf16 32768 c1 (the
# winner) beside c2 s2/s3, bf16 65536 c2 (the winner) beside c4, fp32 32768 c2, and a copy.
set -u
mkdir -p "$OUT"
C=bfloat16:32768:t512v8r1-bulk-two_pass-c1-p0-s2,bfloat16:32768:t512v8r1-bulk-two_pass-c2-p0-s2
C=$C,bfloat16:32768:t512v8r1-bulk-two_pass-c2-p0-s3,bfloat16:65536:t512v8r1-bulk-two_pass-c2-p0-s2
C=$C,bfloat16:65536:t512v8r1-bulk-two_pass-c4-p0-s3,float32:32768:t512v4r1-bulk-two_pass-c2-p0-s3
timeout 400 python3 benchmarks/lab/timeline_lab.py --out "$OUT" --runs 7 --copy --configs "$C" \
  2>&1 | grep -v Warning | tee "$OUT/timeline_xchg.log"
