"""untuned.py's tuned mode: each bulk shape tuned into the tuned mode's user database."""

from __future__ import annotations

import argparse
import contextlib
import sqlite3
import time
from pathlib import Path

from .failures import short_error
from .untuned_modes import Modes
from .untuned_shapes import Case
from .untuned_tables import number_or_dash


def copy_database(source: Path, target: Path) -> None:
    """Copy a SQLite database whole, pages still in its write-ahead log included."""
    with contextlib.closing(sqlite3.connect(source)) as src, \
            contextlib.closing(sqlite3.connect(target)) as dst:
        src.backup(dst)


def tune_bulk(cases: list[Case], args: argparse.Namespace, modes: Modes, deadline: float,
              log, target: Path) -> list[dict]:
    """Tune each bulk shape into ``target``; one record per shape.

    A shape ``target`` already holds a current winner of on this GPU (one lookup would run)
    is kept as it is (status ``kept``), so a run cut short by its time limit resumes where it
    stopped.
    """
    import optuna
    from tune_grid import WarmIsolated

    from autonorm.dtypes import normalize_dtype
    from autonorm.lookup import USABLE, verdict
    from autonorm.ops import registry
    from autonorm.runtime.device import query_device
    from autonorm.store.db import TuningDB, TuningKey
    from autonorm.tune.search import TuneSettings
    from autonorm.tune.session import tune_and_store

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    info = query_device()
    family = registry.get("layer_norm")
    # The grid tuner's finals (3 candidates, 3 rounds): a shorter tail after each search.
    settings = TuneSettings(n_trials=args.tune_trials, timeout_s=args.tune_timeout,
                            seed=args.seed, finals_top=3, finals_rounds=3)
    factory = WarmIsolated(info.limits())
    studies = modes.tuned_db.parent / "studies"
    studies.mkdir(exist_ok=True)
    out = []
    with TuningDB(target) as db:
        for case in cases:
            rec = {"dtype": case.dtype, "hidden": case.hidden, "rows": case.rows,
                   "status": "skipped", "label": None, "share": None, "evaluated": None,
                   "seconds": None, "error": None}
            out.append(rec)
            try:
                problem = family.problem(hidden=case.hidden, dtype=normalize_dtype(case.dtype))
                held = db.get_winner(TuningKey.for_problem(info.fingerprint, problem, case.rows))
                # A winner this code renders another kernel for (or refuses) is tuned again.
                status, config = (verdict(held, problem, info.limits()) if held is not None
                                  else (None, None))
            except Exception as exc:  # noqa: BLE001 - the shape's tuned mode reports it
                rec.update(status="error", error=short_error(exc))
                continue
            if status == USABLE:
                share = held.metrics.get("share") if isinstance(held.metrics, dict) else None
                rec.update(status="kept", share=share, label=config.label())
                log(f"tuned {case.label()}: {rec['label']} (in {target} already)")
                continue
            if time.perf_counter() > deadline:
                continue
            started = time.perf_counter()
            try:
                tuned = tune_and_store(problem, case.rows, settings=settings, device=info,
                                       storage=str(studies), store=db,
                                       evaluator_factory=factory, quiet=True)
                rec.update(status="ok" if tuned.stored else "error", evaluated=tuned.evaluated,
                           label=tuned.config.label() if tuned.stored else None,
                           share=tuned.timing.share if tuned.stored else None,
                           error=None if tuned.stored else f"nothing verified {tuned.failures}")
            except Exception as exc:  # noqa: BLE001 - the shape's tuned mode reports it
                rec.update(status="error", error=short_error(exc))
            rec["seconds"] = time.perf_counter() - started
            share = number_or_dash(rec["share"] and rec["share"] * 100, ".1f", "%")
            log(f"tuned {case.label()}: {rec['label'] or rec['error']} {share} "
                f"({rec['seconds']:.0f} s)")
    return out
