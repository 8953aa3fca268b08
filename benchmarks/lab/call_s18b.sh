#!/usr/bin/env bash
# Session 18, call b (~5 min): A/B of the 16-bit shift folded into the normalizing fma
# (convert.cuh.j2 fold_test; working tree) against main's templates (lab/templates_base, from
# git archive HEAD). Each shape's shipped winner, verified, 5 rounds interleaved; fp32 16384
# (code unchanged) as the noise control. Then the kernel and bulk GPU tests on the new tree.
# Prediction (s18a ncu: bf16 32768 bulk issue slots 43.5% busy against fp32 16384's 26.8%; the
# store pass 44% of its warp samples; one add of ~14.7 instructions an element gone):
# x1.000-1.015 at 16-bit 12288-65536, x1.00 at 1024-8192 and on the control.
# Before the call, at 254045a: mkdir -p benchmarks/lab/templates_base && git archive HEAD templates
# | tar -x --strip-components=1 -C benchmarks/lab/templates_base && git apply
# benchmarks/lab/tree_patches/s18_fold_shift.patch (NOTES.md 87: x0.993-1.005, not adopted).
set -u
mkdir -p "$OUT"
L=benchmarks/lab
ONLY=bfloat16:1024,bfloat16:4096,bfloat16:8192,bfloat16:12288,bfloat16:16384,float16:16384,bfloat16:32768,float16:32768,bfloat16:65536,float32:16384
timeout 220 python3 $L/ab_lab.py --base $L/templates_base --top 1 --rounds 5 --budget-s 170 \
  --out "$OUT/fold" --only $ONLY 2>&1 | grep -v "━" | tee "$OUT/ab_fold.log" \
  | grep -v "^\s*$" | grep -E "SHAPE|x[01]\.|rror|raceback" | tail -40
timeout 200 python3 -m pytest -q -m gpu tests/test_gpu_kernels.py tests/test_gpu_bulk.py \
  -p no:cacheprovider > "$OUT/gpu_kb.log" 2>&1; tail -6 "$OUT/gpu_kb.log"
