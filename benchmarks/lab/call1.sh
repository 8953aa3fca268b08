#!/usr/bin/env bash
# Lab run 1 on the GPU machine: two-GPU tests, host-cost probe, bulk-copy kernel sweep.
set -u
export PYTHONUNBUFFERED=1 AUTONORM_CACHE_DIR=/tmp/ac CUPY_CACHE_DIR=/tmp/cc
OUT=${OUT:-/tmp/out}
nvidia-smi -L
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -ra \
  tests/test_gpu_inputs.py::test_weight_on_another_gpu \
  tests/test_torch.py::test_gpu_tensor_on_a_non_current_device 2>&1 | tail -6 | tee $OUT/two_gpu.log
timeout 100 python3 benchmarks/lab/host_probe.py 2>&1 | tee $OUT/host_probe.log
timeout 360 python3 benchmarks/lab/bulk_lab.py --out $OUT --budget-s 330 > $OUT/bulk_lab.log 2>&1
grep -E "BEST|shipped|^copy|Error|error|budget" $OUT/bulk_lab.log | head -80
