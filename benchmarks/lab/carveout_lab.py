"""Lab only: does the shared-memory carveout the driver picks cost the fwd winners their L1?

ncu at bf16 16384 (NOTES.md 44) showed the smem winner (t256v8r1-smem-m64, 4 blocks an SM) at a
168 KB carveout with an L1 hit rate of 38.6%, while every row re-reads 64 KB of weight and bias
(3-7% of the time from 12288 up, NOTES.md 45). Four blocks need only about 132 KB of shared
memory; the rest of the 256 KB is L1. If the driver's default carveout leaves L1 short, asking
for the smallest carveout that keeps the same blocks per SM should raise the L1 hits on weight
and bias and cut L2 traffic, with no template change (so no re-tune).

Each shape's shipped winner is timed as single launches after an L2 flush by a read (as the
peers do) under several carveout preferences (percent of the 228 KB maximum; -1 = the driver's
default), interleaved round by round, beside a copy of the same bytes. Prints the median us of
each, its share of the copy and the ratio to the default, with the blocks per SM the occupancy
API reports under that preference.

Run on the GPU machine: ``python benchmarks/lab/carveout_lab.py --out $OUT``.
"""

from __future__ import annotations

import ctypes
import json
import math
import sqlite3
import statistics
from pathlib import Path

import cupy
import lab_eval
from ab_lab import top_configs
from fixed_lab import time_with

from autonorm import bench, compiler
from autonorm.evaluator import GpuEvaluator
from autonorm.space import Problem

SHAPES = (
    ("bfloat16", 16384), ("float16", 16384), ("bfloat16", 12288), ("float16", 12288),
    ("bfloat16", 8192), ("float16", 8192), ("bfloat16", 4096), ("bfloat16", 2048),
    ("bfloat16", 1024), ("float16", 1024), ("float32", 1024), ("float32", 4096),
    ("float32", 8192), ("bfloat16", 32768),
)
ATTR_CARVEOUT = 9  # CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
MAX_SMEM = 228 * 1024  # shared memory an H100/H200 SM can carve out
RESERVED = 1024  # shared memory the system reserves per block (sm_90)


def blocks_per_sm(fn_ptr: int, threads: int, smem: int) -> int:
    """Resident blocks per SM the occupancy API reports for this function now."""
    count = ctypes.c_int(0)
    code = compiler.driver_library().cuOccupancyMaxActiveBlocksPerMultiprocessor(
        ctypes.byref(count), ctypes.c_void_p(fn_ptr), threads, ctypes.c_size_t(smem))
    assert code == 0, f"cuOccupancyMaxActiveBlocksPerMultiprocessor: {code}"
    return count.value


def set_carveout(fn_ptr: int, percent: int) -> None:
    """cuFuncSetAttribute(PREFERRED_SHARED_MEMORY_CARVEOUT): a hint the driver rounds up."""
    code = compiler.driver_library().cuFuncSetAttribute(
        ctypes.c_void_p(fn_ptr), ATTR_CARVEOUT, ctypes.c_int(percent))
    assert code == 0, f"cuFuncSetAttribute({percent}): {code}"


def main() -> None:
    args = lab_eval.lab_arguments(offline=False).parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(Path(__file__).parents[2] / "tuning_db" / "autonorm.db")
    stream = cupy.cuda.Stream(non_blocking=True)
    records = []
    for dtype, hidden in SHAPES:
        problem = Problem(hidden, dtype)
        config = top_configs(db, dtype, hidden, 1)[0]
        rows = (1 << 26) // hidden
        ev = GpuEvaluator(problem, rows)
        if ev.evaluate(config).status != "ok":
            print(dtype, hidden, config.label(), "failed verification", flush=True)
            continue
        kernel = ev._compile(config)  # noqa: SLF001 - lab
        fn = kernel._function.ptr  # noqa: SLF001
        plan = kernel.plan
        launch = ev._launcher(kernel)  # noqa: SLF001
        static = int(kernel.attributes.get("shared_size_bytes", 0))
        per_block = plan.smem_bytes + static + RESERVED
        default_blocks = blocks_per_sm(fn, plan.threads, plan.smem_bytes)
        need = math.ceil(100 * default_blocks * per_block / MAX_SMEM)
        prefs = sorted({-1, 0, min(100, need), 50, 100})
        blocks = {}
        for p in prefs:
            set_carveout(fn, p)
            blocks[p] = blocks_per_sm(fn, plan.threads, plan.smem_bytes)
        flush = bench._flush_buffer(0, bench.FLUSH_L2_MULTIPLE * ev.info.l2_bytes)  # noqa: SLF001
        copy_src = cupy.ones(ev.nbytes // 8, dtype=cupy.float32)
        copy = bench._copy_launch(copy_src)  # noqa: SLF001
        per: dict[str, list[float]] = {"copy": []} | {str(p): [] for p in prefs}
        for _ in range(args.rounds):
            per["copy"].append(time_with(copy, None, flush, stream, ev.n_sets))
            for p in prefs:
                set_carveout(fn, p)
                per[str(p)].append(time_with(launch, None, flush, stream, ev.n_sets))
        set_carveout(fn, -1)
        med = {k: statistics.median(v) for k, v in per.items()}
        print(f"{dtype:8s} {hidden:6d} {config.label():36s} smem/block {per_block:6d} B, "
              f"need {need}%; copy {med['copy']:.2f} us", flush=True)
        for p in prefs:
            print(f"    carveout {p:4d}%: {med[str(p)]:7.2f} us  {med['copy'] / med[str(p)]:6.1%}"
                  f" of copy  x{med['-1'] / med[str(p)]:.3f}  blocks/SM {blocks[p]}", flush=True)
        records.append(dict(dtype=dtype, hidden=hidden, label=config.label(), need=need,
                            blocks=blocks, us=med, rounds=per))
        json.dump(records, open(out / "carveout_lab.json", "w"), indent=1)
        del ev, copy_src, copy
        lab_eval.free_gpu_memory()


if __name__ == "__main__":
    main()
