"""untuned.py's tuned mode: each bulk shape tuned into a temporary user database."""

from __future__ import annotations

import argparse
import time

from .failures import short_error
from .untuned_modes import Modes
from .untuned_shapes import Case
from .untuned_tables import number_or_dash


def tune_bulk(cases: list[Case], args: argparse.Namespace, modes: Modes, deadline: float,
              log) -> list[dict]:
    """Tune each bulk shape into the temporary user database; one record per shape."""
    import optuna
    from tune_grid import WarmIsolated

    from autonorm.dtypes import normalize_dtype
    from autonorm.ops import registry
    from autonorm.runtime.device import query_device
    from autonorm.store.db import TuningDB
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
    with TuningDB(modes.tuned_db) as db:
        for case in cases:
            rec = {"dtype": case.dtype, "hidden": case.hidden, "rows": case.rows,
                   "status": "skipped", "label": None, "share": None, "evaluated": None,
                   "seconds": None, "error": None}
            out.append(rec)
            if time.perf_counter() > deadline:
                continue
            started = time.perf_counter()
            try:
                problem = family.problem(hidden=case.hidden, dtype=normalize_dtype(case.dtype))
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
