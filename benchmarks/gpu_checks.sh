#!/usr/bin/env bash
# One GPU session's checks, in order (run from the repo root on the GPU machine, OUT set):
# GPU tests, a cold-start tune of the main job, dispatch to its winner; `grid` and `buckets`
# re-tune the shipped DB (needed after any kernel-template change: the winners are keyed by the
# templates' hash, and tests/test_dispatch.py fails until the DB matches).
# Each suite fits one 10-minute device command: bash benchmarks/gpu_checks.sh
# tests|tune|grid|buckets|ship|search|peers|ncu. `ship` runs grid and buckets in one command (~370 s
# on an H200) and merges them into $OUT/shipped.db, the file to copy to tuning_db/autonorm.db.
# `search DTYPE:H,H ...` gives chosen shapes 60 trials and merges them into tuning_db/ (and
# $OUT/shipped.db); `peers` runs the full peers benchmark on the working tree's DB (~170 s);
# `ncu DTYPE:H ...` profiles the dispatched kernel beside torch.compile's.
# By hand:
#   cp <grid OUT>/ship.db tuning_db/autonorm.db
#   python benchmarks/lab/merge_db.py <buckets OUT>/buckets.db tuning_db/autonorm.db
set -u
export PYTHONUNBUFFERED=1 AUTONORM_CACHE_DIR=${AUTONORM_CACHE_DIR:-/tmp/autonorm-cache}
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-/tmp/cupy-cache}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
suite=${1:-all}
if [[ $suite == all || $suite == tests ]]; then
  # No -x: one failure must not hide the rest. The log goes to $OUT first, so a run cut short
  # by the timeout still says how far it got.
  timeout 540 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider -ra --durations=15 \
    > "$OUT/gpu_tests.log" 2>&1; tail -40 "$OUT/gpu_tests.log"
fi
if [[ $suite == all || $suite == tune ]]; then
  rm -rf "$AUTONORM_CACHE_DIR" "$CUPY_CACHE_DIR"
  /usr/bin/time -f "tune wall %e s" timeout 150 python3 -m autonorm tune --hidden 16384 --dtype bf16 2>&1 | grep -v "━" | tee "$OUT/tune.log" | tail -12
  python3 -m autonorm show 2>&1 | tail -8
  python3 - <<'PY' 2>&1 | tee "$OUT/dispatch.log"
import cupy, numpy as np, autonorm
from ml_dtypes import bfloat16
from autonorm import dispatch
from autonorm.space import Problem
x = cupy.random.standard_normal((4096, 16384), dtype=cupy.float32).astype(bfloat16)
w = cupy.ones(16384, dtype=bfloat16); b = cupy.zeros(16384, dtype=bfloat16)
y = autonorm.layer_norm(x, w, b, 1e-5)
c = dispatch.chosen(Problem(16384, "bfloat16"), 4096)
xf = x.astype(cupy.float64); ref = (xf - xf.mean(1, keepdims=True)) / cupy.sqrt(xf.var(1, keepdims=True) + 1e-5)
err = float(cupy.linalg.norm(y.astype(cupy.float64) - ref) / cupy.linalg.norm(ref))
print("dispatch chose", c.source, c.config.label(), "rel err", f"{err:.2e}")
PY
fi
if [[ $suite == grid || $suite == ship ]]; then
  # The benchmark grid: 3 dtypes x 9 hidden sizes at rows = 2^26 / hidden (~270 s on an H200).
  AUTONORM_DB=$OUT/ship.db timeout 330 python3 benchmarks/tune_grid.py --dtypes bf16,fp32,fp16 \
    --trials 24 --timeout 10 2>&1 | tee "$OUT/grid.log"
fi
if [[ $suite == buckets || $suite == ship ]]; then
  # The LLM token count at 4096/8192 and the latency rows at 16384 (peers.py's shapes). Rows 64
  # and 512 need more trials: with 10, rows 512 stopped at 51% of copy; with 30, 68% (bulk).
  AUTONORM_DB=$OUT/buckets.db timeout 100 python3 benchmarks/tune_grid.py --dtypes bf16,fp16,fp32 \
    --hidden 4096,8192 --rows 4096 --trials 12 --timeout 5 2>&1 | tee "$OUT/buckets.log"
  AUTONORM_DB=$OUT/buckets.db timeout 60 python3 benchmarks/tune_grid.py --dtypes bf16,fp16,fp32 \
    --hidden 16384 --rows 1,8 --trials 10 --timeout 3 2>&1 | tee -a "$OUT/buckets.log"
  AUTONORM_DB=$OUT/buckets.db timeout 200 python3 benchmarks/tune_grid.py --dtypes bf16,fp16,fp32 \
    --hidden 16384 --rows 64,512 --trials 30 --timeout 12 2>&1 | tee -a "$OUT/buckets.log"
fi
if [[ $suite == ship ]]; then
  cp "$OUT/ship.db" "$OUT/shipped.db"
  python3 benchmarks/lab/merge_db.py "$OUT/buckets.db" "$OUT/shipped.db" | tail -3
fi
if [[ $suite == search ]]; then
  # 60 trials, 22 s a shape, into $OUT/long.db; merge_db takes a winner only >1 point better.
  shift
  for spec in "$@"; do
    shapes=$(( $(tr -cd , <<< "${spec#*:}" | wc -c) + 1 ))
    AUTONORM_DB=$OUT/long.db timeout $(( 22 * shapes + 40 )) python3 benchmarks/tune_grid.py \
      --dtypes "${spec%%:*}" --hidden "${spec#*:}" --trials 60 --timeout 22 2>&1 \
      | grep -v "^\s*$" | grep -v "━" | tee -a "$OUT/long.log" | tail -4
  done
  python3 benchmarks/lab/merge_db.py "$OUT/long.db" tuning_db/autonorm.db | tee "$OUT/merge.log"
  cp tuning_db/autonorm.db "$OUT/shipped.db"
fi
if [[ $suite == peers ]]; then
  # Its own kernel cache, as the call scripts of sessions 9-22 ran it.
  AUTONORM_CACHE_DIR=/tmp/ac_peers timeout 270 python3 benchmarks/peers.py --out "$OUT/peers" \
    --plain --budget-s 240 > "$OUT/peers_full.log" 2>&1
  tail -75 "$OUT/peers_full.log"
fi
if [[ $suite == ncu ]]; then
  # Only the launches between cudaProfilerStart/Stop (benchmarks/lab/ncu_peers.py).
  shift
  timeout 200 ncu --profile-from-start off --clock-control none --section SpeedOfLight \
    --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section InstructionStats \
    python3 benchmarks/lab/ncu_peers.py "$@" > "$OUT/ncu_peers.txt" 2>&1
  grep -E "^  [a-z_]|autonorm|triton|Duration|DRAM Throughput|Registers Per|Achieved Occ|Issue \
Slots Busy|Executed Ipc A|Executed Instructions  |Eligible Warps|No Eligible|Block Size|Grid Size|Stall" \
    "$OUT/ncu_peers.txt" | head -90
fi
