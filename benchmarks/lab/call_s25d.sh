#!/usr/bin/env bash
# Session 25, call D: call C's GPU suite met cudaErrorIllegalInstruction in the sampled sweep at
# fp32 16384 (tests/test_gpu_kernels.py). Each keep_x config of that sample and of the later
# ones, and its plain twin, verified in a process of its own.
set -u
mkdir -p "$OUT"
timeout 400 python3 benchmarks/lab/keepx_diag.py \
  16384:float32:t256v1r1-smem-welford-c1-p2-k 16384:float32:t512v1r8-none-welford-c1-p8-k \
  16384:float32:t32v4r1-smem-two_pass-c2-p0-k 16384:float16:t512v8r1-smem-two_pass-c1-p4-k \
  16384:float16:t256v1r4-smem-two_pass-c1-p8-k-m64 16384:float16:t1024v4r1-smem-welford-c1-p1-k \
  16384:bfloat16:t64v8r1-smem-two_pass-c2-p2-k 65536:float32:t64v4r1-smem-two_pass-c4-p4-k \
  65536:float32:t256v1r1-smem-welford-c8-p8-k 65536:float16:t32v8r1-smem-welford-c1-p2-k \
  2>&1 | tee "$OUT/diag.log"
