"""Tune a grid of shapes into one tuning database: how ``tuning_db/autonorm.db`` is built.

Runs on a GPU. Every (dtype, hidden size, row count) of the grid goes through
:func:`autonorm.tune.session.tune_and_store`, the path ``autonorm tune`` takes: the search
runs with crash isolation, every trial is recorded, and each winner is stored with the digest
of its kernel. Re-running resumes each shape's study. At the end the database is checkpointed
out of WAL mode, so the file stands alone (ready to ship).

Example (the shipped grid, written to a fresh file)::

    python benchmarks/tune_grid.py --db /tmp/ship.db --dtypes bf16,fp16,fp32 --trials 16
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import optuna

from autonorm import settings
from autonorm.dtypes import normalize_dtype
from autonorm.ops import registry
from autonorm.runtime.device import query_device
from autonorm.runtime.limits import DeviceLimits
from autonorm.store.db import TuningDB
from autonorm.tune.isolation import IsolatedEvaluator, build_gpu_evaluator
from autonorm.tune.search import TuneSettings
from autonorm.tune.session import TunedKernel, tune_and_store

DEFAULT_HIDDEN = "768,1024,2048,4096,8192,12288,16384,32768,65536"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(
        prog="tune_grid.py",
        description="Tune every (dtype, hidden size, row count) of a grid on this GPU and "
        "store the winners in one tuning database (how the shipped database is built).",
    )
    parser.add_argument("--op", default="layer_norm", choices=registry.known(),
                        help="kernel family to tune (default: %(default)s)")
    parser.add_argument("--dtypes", default="bf16,fp16,fp32",
                        help="comma-separated dtypes: bf16, fp16, fp32 or full names "
                        "(default: %(default)s)")
    parser.add_argument("--hidden", default=DEFAULT_HIDDEN,
                        help="comma-separated hidden sizes (default: %(default)s)")
    parser.add_argument("--elements", type=int, default=1 << 26,
                        help="rows per shape are elements // hidden, the benchmark grid "
                        "(default: %(default)s = 2^26)")
    parser.add_argument("--rows", default="",
                        help="comma-separated row counts to tune at every hidden size instead "
                        "of elements // hidden, e.g. 1,8,64,512 (latency buckets)")
    parser.add_argument("--trials", type=int, default=16,
                        help="candidates measured per shape (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=12.0,
                        help="search seconds per shape, finals excluded (default: %(default)s)")
    parser.add_argument("--finals-top", type=int, default=3,
                        help="best candidates re-timed against the incumbent per shape "
                        "(default: %(default)s)")
    parser.add_argument("--finals-rounds", type=int, default=3,
                        help="interleaved rounds of the finals (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="sampler seed (default: %(default)s)")
    parser.add_argument("--db", type=Path, default=None,
                        help="tuning database to write (default: the user database, "
                        "AUTONORM_DB or the cache dir)")
    parser.add_argument("--storage", default=None,
                        help="Optuna storage of the studies (default: one journal file per "
                        "study in the cache dir)")
    args = parser.parse_args(argv)
    if args.trials < 1 or args.timeout <= 0 or args.elements < 1:
        parser.error("--trials and --elements must be >= 1 and --timeout > 0")
    return args


def grid(args: argparse.Namespace) -> list[tuple[str, int, int]]:
    """Return the (dtype, hidden, rows) shapes of the grid, in tuning order."""
    hiddens = [int(h) for h in args.hidden.split(",") if h]
    fixed_rows = [int(r) for r in args.rows.split(",") if r]
    return [
        (normalize_dtype(dtype), hidden, rows)
        for dtype in args.dtypes.split(",") if dtype
        for hidden in hiddens
        for rows in (fixed_rows or [max(1, args.elements // hidden)])
    ]


def warm_gpu_evaluator(problem: Any, rows: int, limits: DeviceLimits) -> Any:
    """Build the GPU evaluator and run the family's default once (in the isolated child).

    The first candidate of a cold process also pays for the compiler's start and the compile
    pool's processes; done here, before the shape's search clock starts, every shape gets its
    whole budget for candidates.
    """
    evaluator = build_gpu_evaluator(problem, rows)
    default = registry.family_of(problem).default(problem, limits)
    evaluator.prepare([default])
    evaluator.evaluate(default)
    return evaluator


class WarmIsolated:
    """An evaluator factory: the warmed GPU evaluator in a crash-isolated child process."""

    def __init__(self, limits: DeviceLimits) -> None:
        self.limits = limits

    def __call__(self, problem: Any, rows: int) -> IsolatedEvaluator:
        return IsolatedEvaluator(warm_gpu_evaluator, (problem, rows, self.limits))


def report(tuned: TunedKernel, seconds: float) -> str:
    """Return the one line printed for a tuned shape."""
    problem = tuned.problem
    shape = f"{problem.dtype:9s} {problem.hidden:6d} r{tuned.rows:<6d}"
    if not tuned.stored:
        return f"{shape} nothing verified {tuned.failures} ({seconds:.0f} s)"
    t = tuned.timing
    kept = " (incumbent kept)" if tuned.incumbent_kept else ""
    return (f"{shape} {t.share * 100:5.1f}% {t.gbps:6.0f} GB/s {t.median_us:7.1f} us "
            f"{tuned.config.label()}{kept} ({seconds:.0f} s)")


def checkpoint(path: Path) -> None:
    """Fold the WAL into the database file and leave WAL mode, so the file stands alone."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("PRAGMA journal_mode=DELETE")
    finally:
        conn.close()


def main(argv: list[str] | None = None) -> int:
    """Tune the grid; return the process exit code."""
    args = parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    family = registry.get(args.op)
    info = query_device()
    tune_settings = TuneSettings(
        n_trials=args.trials, timeout_s=args.timeout, seed=args.seed,
        finals_top=args.finals_top, finals_rounds=args.finals_rounds,
    )
    factory = WarmIsolated(info.limits())
    db = TuningDB(args.db) if args.db is not None else TuningDB.open_user()
    path = db.path or settings.user_db_path()
    print(f"tuning {args.op} on {info.name} into {path}", flush=True)
    try:
        for dtype, hidden, rows in grid(args):
            started = time.monotonic()
            problem = family.problem(hidden=hidden, dtype=dtype)
            tuned = tune_and_store(
                problem, rows, settings=tune_settings, device=info, storage=args.storage,
                store=db, evaluator_factory=factory, quiet=True,
            )
            print(report(tuned, time.monotonic() - started), flush=True)
    except KeyboardInterrupt:
        print("interrupted: finished shapes are stored; re-run to resume", file=sys.stderr)
        return 130
    finally:
        db.close()
        checkpoint(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
