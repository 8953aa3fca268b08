#!/usr/bin/env bash
# Session 13: the host cost of a call before and after the launch path's changes (struct-packed
# parameters, cuLaunchKernel without argtypes, data pointers read once, the last grid reused).
# benchmarks/lab/old_tree holds HEAD's autonorm (git archive; untracked). Alternating processes,
# three each, since the host's state moves these figures 1.5-2x (NOTES.md 62). Then the GPU tests
# of the paths touched.
set -u
mkdir -p "$OUT"
L=benchmarks/lab
for i in 1 2 3; do
  for tree in old new; do
    if [[ $tree == old ]]; then root=$PWD/$L/old_tree; else root=$PWD; fi
    echo "== $tree run $i" | tee -a "$OUT/host_ab.log"
    PYTHONPATH=/tmp/site:$root:$PWD/$L timeout 60 python3 $L/host_launch_probe.py 2>&1 \
      | grep -v Warning | tail -2 | tee -a "$OUT/host_ab.log"
  done
done
timeout 300 python3 -m pytest -q -m gpu tests/test_torch.py tests/test_gpu_inputs.py \
  tests/test_gpu_kernels.py tests/test_gpu_schedule.py tests/test_export.py tests/test_dispatch.py \
  -p no:cacheprovider -ra > "$OUT/gpu_tests_launch.log" 2>&1
tail -8 "$OUT/gpu_tests_launch.log"
