"""Tune a grid of shapes into one DB (how tuning_db/autonorm.db is built). Run on the GPU.

    AUTONORM_DB=/tmp/ship.db python benchmarks/tune_grid.py --dtypes bf16,fp32 --trials 16

Every shape is tuned at rows = 2^26 / hidden (the benchmark grid). One compile pool serves all
shapes. The DB is checkpointed out of WAL mode at the end, so the file stands alone.
"""

from __future__ import annotations

import argparse
import logging
import sqlite3
import time

from autonorm import settings as config
from autonorm.dtypes import normalize_dtype
from autonorm.ops import layer_norm as codegen
from autonorm.ops import layer_norm as space
from autonorm.ops.base import rows_bucket
from autonorm.ops.layer_norm.problem import Problem
from autonorm.runtime.compiler import CompilePool
from autonorm.runtime.device import query_device
from autonorm.store import db
from autonorm.tune import tuner
from autonorm.tune.evaluator import GpuEvaluator


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtypes", default="bf16,fp16,fp32")
    parser.add_argument("--hidden", default="768,1024,2048,4096,8192,12288,16384,32768,65536")
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--timeout", type=float, default=12.0)
    parser.add_argument("--elements", type=int, default=1 << 26)
    parser.add_argument("--rows", default="", help="row counts to tune instead of "
                        "elements // hidden, e.g. 1,8,64,512 (latency buckets)")
    args = parser.parse_args()
    logging.getLogger("optuna").setLevel(logging.WARNING)
    info = query_device()
    pool = CompilePool()
    store = db.TuningDB.open_user()
    store.record_device(info)
    version = codegen.code_version()
    # Warm up once (CUDA context, CuPy, NVRTC, the pool's workers) before any shape's clock runs:
    # in session 7 the first shape (bf16 768, 10 s) spent its time on that and measured one trial.
    warm = Problem(4096, "float32")
    GpuEvaluator(warm, 4096, pool=pool).evaluate(space.default_config(warm, info.limits()))
    for dtype in args.dtypes.split(","):
        for hidden, rows in [
            (h, r) for h in map(int, args.hidden.split(","))
            for r in (list(map(int, args.rows.split(","))) if args.rows
                      else [max(1, args.elements // h)])
        ]:
            t0 = time.monotonic()
            problem = Problem(hidden, normalize_dtype(dtype))
            key = db.TuningKey.for_problem(info.fingerprint, version, problem, rows)
            evaluator = GpuEvaluator(problem, rows, pool=pool)
            study = tuner.study_name_for(info.fingerprint, version, problem, rows_bucket(rows))

            def on_trial(cfg, outcome, number, key=key):  # noqa: ANN001
                # With its timing (the grid DBs of sessions 1-7 kept none, so lab scripts could
                # not rank a shape's trials by speed).
                store.record_outcome(key, cfg, outcome, trial_number=number)

            result = tuner.tune(
                problem, evaluator, limits=info.limits(), study_name=study,
                settings=tuner.TuneSettings(n_trials=args.trials, timeout_s=args.timeout,
                                            finals_top=3, finals_rounds=3),
                on_trial=on_trial, progress=False,
                seeds=space.seed_configs(problem, info.limits(), rows),
            )
            if result.best is not None and result.timing is not None:
                t = result.timing
                copy_gbps = t.copy_gbps or evaluator.copy_gbps
                store.set_winner(key, result.best.to_dict(), t.metrics(
                    rows=rows, trials=result.evaluated, copy_gbps=copy_gbps))
                print(f"{problem.dtype:9s} {hidden:6d} r{rows:<6d} {t.share * 100:5.1f}% "
                      f"{t.gbps:6.0f} GB/s "
                      f"{t.median_us:7.1f} us {result.best.label()} "
                      f"({time.monotonic() - t0:.0f} s)", flush=True)
            else:
                print(f"{problem.dtype} {hidden}: nothing verified {result.failures}", flush=True)
            del evaluator
    store.close()
    pool.close()
    conn = sqlite3.connect(config.user_db_path())
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("PRAGMA journal_mode=DELETE")
    conn.close()


if __name__ == "__main__":
    main()
