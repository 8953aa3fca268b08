#!/usr/bin/env bash
# Session 7, call E (final shipped DB): ncu of the capped 16-bit winners next to torch.compile at
# bf16 768 / 16384 and fp16 8192 (issue slots, instructions: is the 16-bit kernel now
# instruction-bound?), for NOTES' "what next".
set -u
mkdir -p "$OUT"
# As run, these lines spelled the ncu command out (7 sections, no MemoryWorkloadAnalysis; see
# git history); gpu_checks.sh's `ncu` suite now holds it.
bash benchmarks/gpu_checks.sh ncu bfloat16:768 bfloat16:16384 float16:8192
