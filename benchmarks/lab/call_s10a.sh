#!/usr/bin/env bash
# Prepared in session 9 for the next session's first call: clustered smem kernels under the
# 64-register cap against the bulk winners at 16-bit 32768/65536 (cluster_cap_lab.py).
set -u
mkdir -p "$OUT"
timeout 300 python3 benchmarks/lab/cluster_cap_lab.py --out "$OUT" 2>&1 | grep -v "━" \
  | tee "$OUT/cluster_cap_lab.log"
