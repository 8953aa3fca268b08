#!/usr/bin/env bash
# Session 10, call C: the cluster exchange by st.async pushes (cluster_push_lab.py), then the GPU
# kernel and bulk tests on the changed templates.
set -u
mkdir -p "$OUT"
timeout 300 python3 benchmarks/lab/cluster_push_lab.py --out "$OUT" 2>&1 | grep -v "━" \
  | tee "$OUT/cluster_push_lab.log"
timeout 240 python3 -m pytest -q -m gpu tests/test_gpu_kernels.py tests/test_gpu_bulk.py \
  -p no:cacheprovider -ra > "$OUT/gpu_kernel_tests.log" 2>&1; tail -15 "$OUT/gpu_kernel_tests.log"
