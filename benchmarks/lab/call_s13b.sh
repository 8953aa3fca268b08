#!/usr/bin/env bash
# Prepared in session 12: where autonorm trails torch.compile by 1-2% (fp32 768 and 4096 at
# 0.98x, bf16/fp16 1024 at 0.99x in session 12's peers run), the dispatched kernel beside
# compile's under ncu (~2 min).
set -u
mkdir -p "$OUT"
timeout 280 bash benchmarks/gpu_checks.sh ncu float32:4096 float32:768 bfloat16:1024 2>&1 | tail -90
