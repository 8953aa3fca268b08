#!/usr/bin/env bash
# GPU checks of autonorm, one suite per command, each sized to fit a 10-minute run on an H200.
# Run from the repository root on a GPU machine; logs and databases go to $OUT (default
# /tmp/out). `bash benchmarks/gpu_checks.sh --help` prints the suites.
set -u

usage() {
  cat <<'EOF'
usage: bash benchmarks/gpu_checks.sh [SUITE [ARGS...]]

GPU checks of autonorm, run from the repository root on a GPU machine. Logs and databases are
written to $OUT (default /tmp/out); caches go to $AUTONORM_CACHE_DIR and $CUPY_CACHE_DIR
(default /tmp/autonorm-cache and /tmp/cupy-cache).

suites:
  all (default)       tests, then tune
  tests [K/N]         the GPU test suite (pytest -m gpu), file by file over every GPU, logs in
                      $OUT/gpu_tests_*.log; K/N runs the K-th of N parts of it on one GPU, so
                      a suite longer than one command runs in N (benchmarks/gpu_tests.py)
  tune                the main job from empty caches: autonorm tune --hidden 16384 --dtype bf16,
                      autonorm show, and a dispatch check against float64 ($OUT/tune.log,
                      $OUT/dispatch.log)
  grid                tune the benchmark grid (bf16, fp16, fp32 x hidden 768-65536 at 2^26
                      elements, 24 trials a shape) into $OUT/shipped.db
  buckets             tune the LLM buckets (4,096 rows at hidden 4096 and 8192) and the latency
                      buckets (rows 1, 8, 64, 512 at hidden 16384) into $OUT/shipped.db
  ship                grid and buckets from an empty $OUT/shipped.db (~6 minutes on an H200):
                      LayerNorm's 45 shipped winners alone (the rest of the shipped database
                      comes from models and the commands of docs/tuning.md)
  models [OPS]        the shapes of autonorm/tuning_db/models.json (decode and prefill buckets,
                      bf16, fp16, fp32) of OPS (default layer_norm,rms_norm,add_rms_norm), one
                      shard a local GPU in parallel, into a copy of the shipped database
                      ($OUT/work.db, kept: re-run to resume), then $OUT/autonorm.db, the file
                      to copy to autonorm/tuning_db/autonorm.db
  search DTYPE:H,H..  60 trials at the chosen shapes against the winners of a copy of
                      autonorm/tuning_db/autonorm.db ($OUT/shipped.db); a stored winner stays
                      unless a challenger beats it by more than the noise in the finals
                      (e.g. search bf16:1024,16384 fp32:4096)
  peers               the full peers benchmark on this tree's database ($OUT/peers/,
                      $OUT/peers_full.log)
  ncu DTYPE:H[:ROWS]  Nsight Compute sections of autonorm's dispatched kernel and
                      torch.compile's at 2^26 elements or ROWS rows ($OUT/ncu_peers.txt);
                      NCU_OPTIONS adds ncu options (e.g. NCU_OPTIONS="--cache-control none")
  ncu-backward OP:DTYPE:H[:ROWS]
                      Nsight Compute of autonorm's dispatched backward kernel and
                      torch.compile's forward + backward kernels at one row of H, or ROWS rows
                      (OP layer_norm or rms_norm, DTYPE a torch dtype name: bfloat16, float16,
                      float32; $OUT/ncu_backward.txt)

The methods and the figures they reproduce: docs/tuning.md, docs/timing.md, docs/results.md.
EOF
}

suite=${1:-all}
case $suite in
  -h|--help|help) usage; exit 0 ;;
  all|tests|tune|grid|buckets|ship|models|search|peers|ncu|ncu-backward) ;;
  *) echo "unknown suite: $suite" >&2; usage >&2; exit 2 ;;
esac
[[ $# -gt 0 ]] && shift

export PYTHONUNBUFFERED=1 AUTONORM_CACHE_DIR=${AUTONORM_CACHE_DIR:-/tmp/autonorm-cache}
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-/tmp/cupy-cache}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
SHIPPED=$OUT/shipped.db

grid() {
  # 3 dtypes x 9 hidden sizes at rows = 2^26 / hidden (~270 s on an H200).
  AUTONORM_DB=$SHIPPED timeout 330 python3 benchmarks/tune_grid.py --dtypes bf16,fp32,fp16 \
    --trials 24 --timeout 10 2>&1 | tee -a "$OUT/grid.log"
}

buckets() {
  # The peers benchmark's other shapes. Rows 64 and 512 take more trials: with 10, rows 512
  # stopped at 51% of copy; with 30 it reached 68% (a bulk-copy kernel).
  AUTONORM_DB=$SHIPPED timeout 100 python3 benchmarks/tune_grid.py --dtypes bf16,fp16,fp32 \
    --hidden 4096,8192 --rows 4096 --trials 12 --timeout 5 2>&1 | tee -a "$OUT/buckets.log"
  AUTONORM_DB=$SHIPPED timeout 60 python3 benchmarks/tune_grid.py --dtypes bf16,fp16,fp32 \
    --hidden 16384 --rows 1,8 --trials 10 --timeout 3 2>&1 | tee -a "$OUT/buckets.log"
  AUTONORM_DB=$SHIPPED timeout 200 python3 benchmarks/tune_grid.py --dtypes bf16,fp16,fp32 \
    --hidden 16384 --rows 64,512 --trials 30 --timeout 12 2>&1 | tee -a "$OUT/buckets.log"
}

if [[ $suite == all || $suite == tests ]]; then
  # No -x: one failure must not hide the rest. Each log goes to $OUT as it is written, so a
  # run cut short still says how far it got.
  part=()
  [[ $suite == tests && $# -gt 0 ]] && part=(--part "$1")
  python3 benchmarks/gpu_tests.py --out "$OUT" --timeout 540 "${part[@]}"
fi

if [[ $suite == all || $suite == tune ]]; then
  rm -rf "$AUTONORM_CACHE_DIR" "$CUPY_CACHE_DIR"
  /usr/bin/time -f "tune wall %e s" timeout 150 python3 -m autonorm tune --hidden 16384 \
    --dtype bf16 2>&1 | grep -v "━" | tee "$OUT/tune.log" | tail -12
  python3 -m autonorm show 2>&1 | tail -8
  python3 - <<'PY' 2>&1 | tee "$OUT/dispatch.log"
import cupy
from ml_dtypes import bfloat16

import autonorm
from autonorm import dispatch
from autonorm.ops.layer_norm.problem import Problem

x = cupy.random.standard_normal((4096, 16384), dtype=cupy.float32).astype(bfloat16)
w = cupy.ones(16384, dtype=bfloat16)
b = cupy.zeros(16384, dtype=bfloat16)
y = autonorm.layer_norm(x, w, b, 1e-5)
choice = dispatch.chosen(Problem(16384, "bfloat16"), 4096)
xf = x.astype(cupy.float64)
ref = (xf - xf.mean(1, keepdims=True)) / cupy.sqrt(xf.var(1, keepdims=True) + 1e-5)
err = float(cupy.linalg.norm(y.astype(cupy.float64) - ref) / cupy.linalg.norm(ref))
print("dispatch chose", choice.source, choice.config.label(), "rel err", f"{err:.2e}")
PY
fi

if [[ $suite == ship ]]; then
  rm -f "$SHIPPED" "$SHIPPED"-wal "$SHIPPED"-shm
fi
if [[ $suite == grid || $suite == ship ]]; then
  grid
fi
if [[ $suite == buckets || $suite == ship ]]; then
  buckets
fi
if [[ $suite == ship ]]; then
  echo "wrote $SHIPPED: copy it to autonorm/tuning_db/autonorm.db"
fi

if [[ $suite == models ]]; then
  ops=${1:-layer_norm,rms_norm,add_rms_norm}
  gpus=$(python3 -c "import cupy; print(cupy.cuda.runtime.getDeviceCount())")
  [[ -f $OUT/work.db ]] || cp autonorm/tuning_db/autonorm.db "$OUT/work.db"
  for ((k = 0; k < gpus; k++)); do
    # A shard starts from the merged winners, so it skips what any shard stored before.
    [[ -f $OUT/shard$k.db ]] || cp "$OUT/work.db" "$OUT/shard$k.db"
    CUDA_VISIBLE_DEVICES=$k timeout 570 python3 benchmarks/tune_grid.py \
      --models autonorm/tuning_db/models.json --ops "$ops" --shard "$k/$gpus" \
      --db "$OUT/shard$k.db" --trials 16 --timeout 4 --skip-stored --budget-s 500 \
      > "$OUT/models$k.log" 2>&1 &
  done
  wait
  for ((k = 0; k < gpus; k++)); do
    grep -v "skipped$" "$OUT/models$k.log" | tail -3
    AUTONORM_DB=$OUT/work.db python3 -m autonorm db import "$OUT/shard$k.db" 2>&1 | tail -1
  done
  python3 - "$OUT/work.db" "$OUT/autonorm.db" <<'PY'
import sys
from pathlib import Path

from autonorm.store.db import TuningDB
from autonorm.store.snapshot import write_snapshot

with TuningDB(Path(sys.argv[1])) as store:
    count = len(store.winners())
    print(f"wrote {write_snapshot(store, Path(sys.argv[2]))}: {count} winners; copy it to "
          "autonorm/tuning_db/autonorm.db")
PY
fi

if [[ $suite == search ]]; then
  if [[ $# -eq 0 ]]; then
    echo "search needs shapes, e.g. bf16:1024,16384 fp32:4096" >&2; exit 2
  fi
  cp autonorm/tuning_db/autonorm.db "$SHIPPED"
  for spec in "$@"; do
    # 60 trials, 22 s a shape; the finals defend each stored winner.
    shapes=$(( $(tr -cd , <<< "${spec#*:}" | wc -c) + 1 ))
    AUTONORM_DB=$SHIPPED timeout $(( 22 * shapes + 40 )) python3 benchmarks/tune_grid.py \
      --dtypes "${spec%%:*}" --hidden "${spec#*:}" --trials 60 --timeout 22 2>&1 \
      | grep -v "^\s*$" | grep -v "━" | tee -a "$OUT/search.log" | tail -4
  done
  echo "wrote $SHIPPED: compare it with autonorm/tuning_db/autonorm.db (autonorm show)," \
    "then copy it"
fi

if [[ $suite == peers ]]; then
  # A kernel cache of its own, so the run compiles what it measures from this tree.
  AUTONORM_CACHE_DIR=/tmp/autonorm-peers timeout 270 python3 benchmarks/peers.py \
    --out "$OUT/peers" --plain --budget-s 240 > "$OUT/peers_full.log" 2>&1
  tail -75 "$OUT/peers_full.log"
fi

if [[ $suite == ncu ]]; then
  if [[ $# -eq 0 ]]; then
    echo "ncu needs shapes, e.g. bfloat16:16384 float32:4096 bfloat16:490:1" >&2; exit 2
  fi
  # Only the launches between cudaProfilerStart and Stop are profiled: torch.compile's warm-up
  # and autotuning stay outside.
  cat > "$OUT/ncu_launch.py" <<'PY'
import sys

import torch
import torch.nn.functional as F

import autonorm.torch as ant
from autonorm import dispatch
from autonorm.dtypes import normalize_dtype
from autonorm.ops.layer_norm.problem import Problem

for spec in sys.argv[1:]:
    parts = spec.split(":")
    dtype, hidden = normalize_dtype(parts[0]), int(parts[1])
    rows = int(parts[2]) if len(parts) > 2 else (1 << 26) // hidden
    choice = dispatch.choose_config(Problem(hidden, dtype), rows)
    tdt = getattr(torch, dtype)
    x = torch.randn(rows, hidden, device="cuda", dtype=tdt)
    w = 1 + 0.1 * torch.randn(hidden, device="cuda", dtype=tdt)
    b = 0.1 * torch.randn(hidden, device="cuda", dtype=tdt)
    compiled = torch.compile(lambda t, w=w, b=b, n=hidden: F.layer_norm(t, (n,), w, b, 1e-5))
    with torch.inference_mode():
        for _ in range(3):
            compiled(x)
            ant.layer_norm(x, w, b)
        torch.cuda.synchronize()
        print(dtype, hidden, rows, "autonorm", choice.source, choice.config.label(), flush=True)
        torch.cuda.profiler.start()
        ant.layer_norm(x, w, b)
        compiled(x)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
PY
  # shellcheck disable=SC2086  # NCU_OPTIONS is a list of options
  timeout 200 ncu ${NCU_OPTIONS:-} --profile-from-start off --clock-control none \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
    --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section InstructionStats \
    python3 "$OUT/ncu_launch.py" "$@" > "$OUT/ncu_peers.txt" 2>&1
  grep -E "^  [a-z_]|autonorm|triton|Duration|DRAM Throughput|Registers Per|Achieved Occ|Issue \
Slots Busy|Executed Ipc A|Executed Instructions  |Eligible Warps|No Eligible|Block Size|Grid Size|Stall" \
    "$OUT/ncu_peers.txt" | head -90
fi

if [[ $suite == ncu-backward ]]; then
  if [[ $# -eq 0 ]]; then
    echo "ncu-backward needs shapes, e.g. layer_norm:bfloat16:1024 rms_norm:float32:4096" \
      "layer_norm:bfloat16:8192:8192" >&2
    exit 2
  fi
  # One row unless ROWS is given: a backward is then one block's chain of steps. With ROWS the
  # scheduler's figures say whether the row loop issues or waits. autonorm's kernel is launched
  # alone (torch.ops.autonorm.norm_backward); torch.compile's backward runs after its forward, and
  # the gradients it accumulates into .grad add elementwise kernels of their own.
  cat > "$OUT/ncu_backward.py" <<'PY'
import sys

import torch
import torch.nn.functional as F

import autonorm.torch  # noqa: F401

for spec in sys.argv[1:]:
    op, dt, hidden, *rows = spec.split(":")
    hidden = int(hidden)
    rows = int(rows[0]) if rows else 1
    tdt = getattr(torch, dt)
    x = torch.randn(rows, hidden, device="cuda", dtype=tdt)
    dy = torch.randn_like(x)
    w = (1 + 0.1 * torch.randn(hidden, device="cuda")).to(tdt)
    b = (0.1 * torch.randn(hidden, device="cuda")).to(tdt)
    if op == "layer_norm":
        ours = lambda: torch.ops.autonorm.norm_backward(dy, x, w, False, True, False, 1e-5)
        f = torch.compile(lambda t, wt, bt: F.layer_norm(t, (hidden,), wt, bt, 1e-5))
    else:
        ours = lambda: torch.ops.autonorm.norm_backward(dy, x, w, True, False, False, 1e-6)
        f = torch.compile(lambda t, wt, bt: F.rms_norm(t, (hidden,), wt, 1e-6))
    xs, ws, bs = (t.detach().clone().requires_grad_(True) for t in (x, w, b))

    def both():
        y = f(xs, ws, bs)
        y.backward(dy)
    for _ in range(3):
        ours()
        both()
    torch.cuda.synchronize()
    print("PROFILE", spec, flush=True)
    torch.cuda.profiler.start()
    ours()
    both()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
PY
  timeout 200 ncu ${NCU_OPTIONS:-} --profile-from-start off --clock-control none \
    --section SpeedOfLight --section LaunchStats --section WarpStateStats \
    --section SchedulerStats \
    python3 "$OUT/ncu_backward.py" "$@" > "$OUT/ncu_backward.txt" 2>&1
  grep -E "PROFILE|^  [a-zA-Z_]|Duration|Elapsed Cycles|SM Active Cycles|Registers Per|\
Warp Cycles Per Issued|DRAM Throughput|Issued Warp Per|No Eligible|Active Warps Per|\
Eligible Warps Per" "$OUT/ncu_backward.txt" | head -160
fi
