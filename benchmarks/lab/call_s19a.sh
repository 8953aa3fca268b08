#!/usr/bin/env bash
# Session 19, call a (~4 min): captured launches get tile counters of their own (workspace).
# The GPU tests that touch it (schedule, torch's graph tests), then graph_sched_lab: graphs of
# each wide shape's dispatched kernel captured as now and as before (static), replayed back to
# back. Prediction (NOTES 57's back-to-back A/B of the dynamic schedule, x1.02-1.066): x1.02-1.06
# at the bulk winners (16-bit 32768-65536, fp32 12288-65536), x1.00 on the fwd control.
set -u
mkdir -p "$OUT"
timeout 200 python3 -m pytest -q -m gpu tests/test_gpu_schedule.py tests/test_torch.py \
  tests/test_workspace.py -p no:cacheprovider > "$OUT/gpu_sched.log" 2>&1; tail -15 "$OUT/gpu_sched.log"
timeout 200 python3 benchmarks/lab/graph_sched_lab.py --rounds 15 --out "$OUT" 2>&1 \
  | tee "$OUT/graph_sched_lab.log" | tail -20
