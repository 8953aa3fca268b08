#!/usr/bin/env bash
# Session 7, call G: the capped 16-bit defaults (space._capped_default) through the product's
# verifier at 20 sizes per 16-bit dtype, and the GPU affine-variant tests of the default.
set -u
mkdir -p "$OUT"
specs=""
for d in bfloat16 float16; do
  for h in 7 100 768 1000 1536 2048 2560 4096 5000 5120 6144 8192 11008 12289 14336 16384 \
           24576 65536 131072 1000002; do specs="$specs $d:$h"; done
done
timeout 150 python3 benchmarks/lab/verify_defaults.py $specs 2>&1 | grep -v "━" \
  | tee "$OUT/verify_defaults.log"
timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_kernels.py \
  -k affine_variants 2>&1 | tail -2
