#!/usr/bin/env bash
# Session 26, call F. (1) keepx_sass.py: the faulting fp32 kernels as rendered and with the
# createpolicy asm volatile, and NVRTC's SASS of the first three (a faulting one, the Welford
# and two-row twins that verify). Prediction: volatile changes nothing (ptxas folds the policy
# to constants either way, as nvcc's SASS of the same source shows). (2) The tuner's search at
# fp32 4096 / 8192 and bf16 8192, now that the space refuses keep_x to fp32 kernels filled by
# cp.async: prediction, the finals pick the new row-a-tile bulk seed or one within a point of
# it. ~260 s.
set -u
mkdir -p "$OUT"
S=smem-two_pass-c1
timeout 150 python3 benchmarks/lab/keepx_sass.py --sass "$OUT/sass.txt" \
  4096:float32:t128v2r1-$S-p0-k 4096:float32:t128v2r1-smem-welford-c1-p0-k \
  4096:float32:t128v2r2-$S-p0-k 4096:float32:t128v4r1-$S-p0-k 16384:float32:t256v2r1-$S-p0-k \
  2>&1 | tee "$OUT/sass_diag.log"
bash benchmarks/gpu_checks.sh search float32:4096,8192 bfloat16:8192
