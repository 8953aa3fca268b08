#!/usr/bin/env bash
# Session 8, call H (final templates and shipped DB): ncu of the winners next to torch.compile at
# bf16 16384 (0.98x compile, now cp.async-filled) and fp32 16384 (90%, level with Liger), for
# NOTES' "what next".
set -u
mkdir -p "$OUT"
bash benchmarks/gpu_checks.sh ncu bfloat16:16384 float32:16384
