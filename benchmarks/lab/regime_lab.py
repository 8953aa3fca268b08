"""Does the tuner's timing regime rank kernels as the peers benchmark's does? On the GPU.

The tuner times back-to-back launches over rotated inputs (``autonorm.bench``); peers.py times
single launches, each after an L2 flush by a read. For each shape (rows = 2^26 / hidden) this
takes the shipped DB's fastest distinct trial configs (their tuner timings), verifies them
through the product's evaluator, then times them both ways, interleaved config by config:

- ``tuner``: ``GpuEvaluator.time`` (rotated inputs, batches of launches);
- ``single``: one launch between CUDA events after summing a 256 MB buffer, median of reps.

Run from the repo root on the GPU machine:
``python benchmarks/lab/regime_lab.py bfloat16:16384 float16:12288 --out $OUT``.
Prints per config the two medians and their ranks; writes ``$OUT/regime_lab.json``.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
from pathlib import Path

import cupy

from autonorm import compiler
from autonorm.evaluator import GpuEvaluator
from autonorm.space import KernelConfig, Problem, rows_bucket

DB = Path(__file__).parents[2] / "tuning_db" / "autonorm.db"


def fastest_trials(dtype: str, hidden: int, k: int) -> list[KernelConfig]:
    """The k fastest distinct configs among the shipped DB's timed trials of the shape."""
    db = sqlite3.connect(DB)
    rows = db.execute(
        "select config, min(median_us) m from trials where dtype=? and hidden=? and status='ok' "
        "and median_us is not null and rows_bucket=? and has_weight=1 and has_bias=1 "
        "group by config order by m limit ?",
        (dtype, hidden, rows_bucket((1 << 26) // hidden), k),
    ).fetchall()
    return [KernelConfig.from_dict(json.loads(r[0])) for r in rows]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("specs", nargs="+", help="dtype:hidden")
    ap.add_argument("--top", type=int, default=6)
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="/tmp/out")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pool = compiler.CompilePool()
    flush = cupy.zeros(256 * 2**20 // 4, dtype=cupy.int32)
    records = []
    for spec in args.specs:
        dtype, hidden = spec.split(":")[0], int(spec.split(":")[1])
        problem = Problem(hidden, dtype)
        rows = (1 << 26) // hidden
        configs = fastest_trials(dtype, hidden, args.top)
        ev = GpuEvaluator(problem, rows, pool=pool)
        ev.prepare(configs)
        ok = [c for c in configs if ev.evaluate(c).status == "ok"]
        kernels = [ev._compile(c) for c in ok]  # noqa: SLF001 - a lab reads the cache
        x, y = ev._xs[0], ev._ys[0]  # noqa: SLF001
        w, b = ev._w, ev._b  # noqa: SLF001
        stream = cupy.cuda.get_current_stream()
        single: list[list[float]] = [[] for _ in ok]
        tuner: list[list[float]] = [[] for _ in ok]
        for _ in range(args.rounds):
            for i, c in enumerate(ok):
                tuner[i].append(ev.time(c, samples=8).median_us)
            for _ in range(args.reps // args.rounds):
                for i, kern in enumerate(kernels):
                    flush.sum()
                    a, e = cupy.cuda.Event(), cupy.cuda.Event()
                    a.record(stream)
                    kern.launch(x.data.ptr, w.data.ptr, b.data.ptr, y.data.ptr, rows, 1e-5,
                                stream.ptr)
                    e.record(stream)
                    e.synchronize()
                    single[i].append(cupy.cuda.get_elapsed_time(a, e) * 1e3)
        med_t = [statistics.median(v) for v in tuner]
        med_s = [statistics.median(v) for v in single]
        rank_t = {i: r for r, i in enumerate(sorted(range(len(ok)), key=lambda i: med_t[i]))}
        rank_s = {i: r for r, i in enumerate(sorted(range(len(ok)), key=lambda i: med_s[i]))}
        print(f"{dtype} {hidden} rows {rows}: tuner us (rank) / single read-flush us (rank)",
              flush=True)
        for i, c in enumerate(ok):
            print(f"    {c.label():44s} {med_t[i]:7.1f} ({rank_t[i]})  {med_s[i]:7.1f} "
                  f"({rank_s[i]})", flush=True)
            records.append({"dtype": dtype, "hidden": hidden, "label": c.label(),
                            "tuner_us": med_t[i], "single_us": med_s[i],
                            "tuner_rank": rank_t[i], "single_rank": rank_s[i]})
        (out / "regime_lab.json").write_text(json.dumps(records, indent=1))
        del ev, kernels
        cupy.get_default_memory_pool().free_all_blocks()
    pool.close()


if __name__ == "__main__":
    main()
