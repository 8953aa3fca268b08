"""Tune one problem on this GPU and store the winner: the one path behind every tuning tool.

:func:`tune_and_store` is what ``autonorm tune`` and ``benchmarks/tune_grid.py`` (which builds
the shipped database) both run. It records the device, finds the incumbent (the stored winner
of the same key, if it still renders to the kernel that was timed; else what dispatch runs for
the key now, :func:`running_pick`), searches with crash
isolation (a faulting kernel costs one candidate, not the study: :mod:`autonorm.tune.isolation`),
records every trial's outcome in the tuning database and stores the winner with the digest of
its kernel (docs/tuning.md).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from autonorm import lookup
from autonorm.ops.base import Config, Problem, rows_bucket
from autonorm.ops.registry import family_of
from autonorm.results import Outcome, Timing
from autonorm.runtime import device as devices
from autonorm.runtime.device import DeviceInfo
from autonorm.runtime.limits import DeviceLimits
from autonorm.store.db import TuningDB, TuningKey
from autonorm.tune import search
from autonorm.tune.evaluator_process import close_evaluator
from autonorm.tune.failures import FailedCandidate, failed_candidates
from autonorm.tune.storage import open_storage, study_name_for
from autonorm.tune.workers import (
    assign_gpus,
    check_shared_storage,
    run_workers,
    visible_gpu_count,
)

__all__ = ["TunedKernel", "incumbent_of", "study_for", "tune_and_store"]

EvaluatorFactory = Callable[[Problem, int], search.Evaluator]


@dataclass(frozen=True)
class TunedKernel:
    """What :func:`tune_and_store` found and stored.

    Attributes:
        problem: what was tuned.
        rows: the row count it was timed at (its power-of-two bucket is in ``key``).
        key: the tuning database key the winner is stored under.
        config: the stored winner, or None when no candidate passed verification (then
            nothing was stored).
        timing: the winner's finals timing.
        metrics: what was stored with it (timing, rows, trials, copy bandwidth).
        kernel: :func:`autonorm.codegen.environment.kernel_digest` of its rendered source.
        kept: which defender stayed because no challenger beat it clearly: ``"incumbent"``
            (the winner stored before); with none stored, where dispatch found what it ran
            (:func:`running_pick`, now stored as the winner): ``"default"`` (the family's
            default), ``"shipped"``, ``"shipped-nearest"``, ``"shipped-neighbour"``,
            ``"user-nearest"`` or ``"user-neighbour"``; or None.
        evaluated: distinct candidates measured in the study so far (all runs, all workers).
        failures: distinct failed configurations of the study, by failure class.
        failed: the study's candidates that failed to compile, launch or verify, newest first
            (:func:`autonorm.tune.failures.failed_candidates`).
        elapsed_s: wall-clock seconds of the call, workers and finals included.
        study: the Optuna study that holds every trial.
        db_path: the database file written (None for an in-memory one).

    """

    problem: Problem
    rows: int
    key: TuningKey
    config: Config | None
    timing: Timing | None
    metrics: dict[str, Any] | None
    kernel: str | None
    kept: str | None
    evaluated: int
    failures: dict[str, int]
    elapsed_s: float
    study: str
    db_path: Path | None
    failed: tuple[FailedCandidate, ...] = ()

    @property
    def stored(self) -> bool:
        """True when a winner was stored."""
        return self.config is not None

    @property
    def incumbent_kept(self) -> bool:
        """True when the winner stored before stayed."""
        return self.kept == "incumbent"

    @property
    def default_kept(self) -> bool:
        """True when, with none stored before, the family's default stayed."""
        return self.kept == "default"

    @property
    def running_kept(self) -> bool:
        """True when, with none stored before, what dispatch ran stayed (default or not)."""
        return self.kept not in (None, "incumbent")

    @property
    def kept_note(self) -> str:
        """What the tools print after the winner's label when a defender stayed, else ''."""
        return f" ({self.kept} kept)" if self.kept else ""


def incumbent_of(
    db: TuningDB, key: TuningKey, problem: Problem, limits: DeviceLimits
) -> Config | None:
    """Return the stored winner of ``key`` if it may still run (:func:`autonorm.lookup.verdict`).

    A winner that no longer passes the family's rules, or whose configuration now renders
    another kernel than the one that was timed, has nothing to defend: the finals then crown
    the fastest challenger.
    """
    found = lookup.stored_verdict(db, key, problem, limits)
    if found is None:
        return None
    status, config = found
    return config if status == lookup.USABLE else None


def running_pick(
    stores: Sequence[TuningDB], problem: Problem, rows: int, device: DeviceInfo,
    limits: DeviceLimits,
) -> lookup.Choice:
    """Return what dispatch runs for ``problem`` at ``rows`` over ``stores``.

    ``stores`` is :func:`autonorm.lookup.dispatch_stores` of the database being written: it
    and then the shipped database (unless that is switched off, or is the same file). Dispatch's
    lookup over them gives an exact winner, the nearest tuned rows bucket, a neighbour's winner
    carried over, else the family's default. Where nothing of the key is stored this pick is
    what a user runs today, so it defends in the finals as a stored winner would: a tuned
    winner is never slower than what ran before.
    """
    return lookup.choose(problem, rows, lookup.Device(device.fingerprint, limits), stores)


def study_for(problem: Problem, rows: int, device: DeviceInfo) -> str:
    """Return the Optuna study :func:`tune_and_store` searches for ``problem`` at ``rows``."""
    version = family_of(problem).code_version()
    return study_name_for(device.fingerprint, version, problem, rows_bucket(rows))


def _open_db(store: TuningDB | str | Path | None) -> tuple[TuningDB, bool]:
    """Return the database to write and whether this call opened it (and so closes it)."""
    if isinstance(store, TuningDB):
        return store, False
    if store is None:
        return TuningDB.open_user(), True
    return TuningDB(store), True


def _build_evaluator(
    problem: Problem, rows: int, device_id: int, factory: EvaluatorFactory | None
) -> Any:
    """Build the evaluator: the caller's factory, or the GPU evaluator in a crash-isolated child."""
    if factory is not None:
        return factory(problem, rows)
    from autonorm.tune.isolation import IsolatedEvaluator, build_gpu_evaluator

    return IsolatedEvaluator(build_gpu_evaluator, (problem, rows, device_id))


def _recorder(
    db: TuningDB, key: TuningKey, study: str, on_trial: search.OnTrial | None
) -> search.OnTrial:
    """Return the search's ``on_trial``: record the outcome in the database, then call on."""

    def record(config: Config, outcome: Outcome, number: int) -> None:
        db.record_outcome(key, config, outcome, study=study, trial_number=number)
        if on_trial is not None:
            on_trial(config, outcome, number)

    return record


def _tune_worker(index: int, spec: dict[str, Any]) -> None:
    """Entry point of one worker process of :func:`tune_and_store` (module level: spawn)."""
    import optuna

    # Optuna logs at INFO from its first import; workers run quietly.
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    problem: Problem = spec["problem"]
    db = TuningDB(spec["db_path"])
    evaluator = _build_evaluator(problem, spec["rows"], 0, spec["evaluator_factory"])
    try:
        search.tune(
            problem, evaluator, limits=spec["limits"], storage=spec["storage"],
            study_name=spec["study"], settings=spec["settings"],
            on_trial=_recorder(db, spec["key"], spec["study"], None),
            progress=index == 0 and not spec["quiet"], worker_index=index,
            # Already enqueued by the parent (_seed_shared_study): the study has trials, so
            # this call enqueues nothing; a worker started without it would seed a new study.
            seeds=spec["seeds"],
        )
    finally:
        close_evaluator(evaluator)
        db.close()


def _seed_shared_study(storage: str | None, study_name: str, seeds: Sequence[Config]) -> None:
    """Enqueue the seeds into a new shared study before its workers start.

    A study takes seeds only while it has no trials. Left to the workers, a worker whose
    evaluator started first asked its own trials before the one meant to seed had opened the
    study, and the seeds were never measured.
    """
    import optuna

    study = optuna.create_study(storage=open_storage(storage, study_name),
                                study_name=study_name, direction="minimize",
                                load_if_exists=True)
    if seeds and not study.get_trials(deepcopy=False):
        for config in seeds:
            study.enqueue_trial(config.to_dict(), skip_if_exists=True)


def _stored_winner(
    db: TuningDB,
    key: TuningKey,
    problem: Problem,
    limits: DeviceLimits,
    rows: int,
    result: search.TuneResult,
    copy_gbps: float,
) -> tuple[dict[str, Any], str]:
    """Store the search's winner with its kernel digest; return (metrics, digest)."""
    timing = result.timing
    assert result.best is not None and timing is not None
    # The finals' copy is timed as they time; an evaluator's back-to-back copy is the fallback.
    metrics = timing.metrics(
        rows=rows, trials=result.evaluated, copy_gbps=timing.copy_gbps or copy_gbps
    )
    kernel = lookup.kernel_of(result.best, problem, limits)
    db.set_winner(key, result.best.to_dict(), metrics, kernel)
    return metrics, kernel


def tune_and_store(
    problem: Problem,
    rows: int,
    *,
    settings: search.TuneSettings = search.TuneSettings(),  # noqa: B008 - frozen, shared safely
    device_id: int = 0,
    device: DeviceInfo | None = None,
    storage: str | None = None,
    workers: int = 1,
    gpus: Sequence[int] | None = None,
    store: TuningDB | str | Path | None = None,
    evaluator_factory: EvaluatorFactory | None = None,
    on_trial: search.OnTrial | None = None,
    quiet: bool = False,
    seeds: Sequence[Config] | None = None,
) -> TunedKernel:
    """Tune ``problem`` at ``rows`` rows on this GPU and store the winner in a tuning database.

    Re-running resumes the study (the same study name for the same GPU, templates, problem and
    rows bucket). The stored winner, if it still renders to the kernel that was timed, is the
    incumbent: it stays unless a challenger beats it by more than the noise in the finals.
    Where none is stored, what dispatch runs for the key now (:func:`running_pick`: a shipped
    winner, the nearest tuned bucket's, a neighbour's, or the family's default) is measured
    first and defends the same way.

    Args:
        problem: what to tune; its family (by op) owns the search space.
        rows: the row count to time at (its power-of-two bucket keys the winner).
        settings: budget and finals of the search (``finals_top`` applies to the last call;
            workers skip the finals).
        device_id: the GPU to tune on (with ``workers`` > 1, see ``gpus``).
        device: the :class:`~autonorm.runtime.device.DeviceInfo` to key the winner by; None
            queries ``device_id``.
        storage: the Optuna storage (see :func:`autonorm.tune.storage.open_storage`; None: one
            journal file per study in the cache directory).
        workers: processes searching the study at once, one per GPU; the finals run here after.
        gpus: the GPU index of each worker (as this process sees them); None: one worker a
            visible GPU, round-robin where there are more workers than GPUs
            (:func:`autonorm.tune.workers.assign_gpus`; with an ``evaluator_factory``, which
            may need no GPU, 0..workers-1).
        store: the tuning database (a :class:`~autonorm.store.db.TuningDB`, left open, or a
            path); None: the user's database.
        evaluator_factory: builds the evaluator as ``evaluator_factory(problem, rows)``
            (picklable with ``workers`` > 1); None: the GPU evaluator in a crash-isolated
            child process.
        on_trial: also called with (config, outcome, trial number) for every candidate judged
            in this process (workers record theirs in the database only).
        quiet: no progress bar.
        seeds: configurations to measure first in a new study; None: the family's seeds.
            Where nothing is stored, what dispatch runs now comes before them, and so does any
            winner of the key that a change of its kernel's code retired
            (:func:`autonorm.lookup.retired_configs`).

    Returns:
        What was stored; ``config`` is None when no candidate passed verification.

    Raises:
        ValueError: ``rows`` or ``workers`` below 1, or a store without a file with workers.
        autonorm.runtime.device.NoGPUError: no ``device`` given and no usable GPU.
        KeyboardInterrupt: after the trial being measured is recorded as interrupted (a rerun
            measures it again).

    """
    if rows < 1:
        raise ValueError(f"rows must be at least 1, got {rows}")
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    started = time.monotonic()
    family = family_of(problem)
    if device is None:
        device = devices.query_device(device_id)
    limits = device.limits()
    db, owned = _open_db(store)
    evaluator = None
    try:
        if workers > 1 and db.path is None:
            raise ValueError("workers need a tuning database file to share, not an in-memory one")
        db.record_device(device)
        key = TuningKey.for_problem(device.fingerprint, problem, rows)
        incumbent = incumbent_of(db, key, problem, limits)
        with lookup.dispatch_stores(db) as stores:  # the shipped database opened once
            running = None if incumbent is not None else running_pick(
                stores, problem, rows, device, limits)
            retired = lookup.retired_configs(stores, key, problem, limits)
        study = study_for(problem, rows, device)
        if seeds is None:
            seeds = family.seeds(problem, limits, rows)
        # What dispatch runs is measured first, so that it verifies and may defend in the
        # finals; then what won the key before its kernel's code changed.
        first = ([running.config] if running is not None else []) + retired
        seeds = list(dict.fromkeys([*first, *seeds]))
        if workers > 1:
            spec = {
                "problem": problem, "rows": rows, "key": key, "limits": limits,
                "storage": storage, "study": study, "seeds": list(seeds), "quiet": quiet,
                "settings": replace(settings, finals_top=0), "db_path": str(db.path),
                "evaluator_factory": evaluator_factory,
            }
            check_shared_storage(workers, storage)  # before the study is touched
            _seed_shared_study(storage, study, seeds)
            if gpus is None and evaluator_factory is None:
                gpus = assign_gpus(workers, visible_gpu_count())
            codes = run_workers(workers, _tune_worker, (spec,), storage_url=storage, gpus=gpus)
            if any(codes):
                # The study keeps what they measured; the call below measures the rest.
                warnings.warn(f"tuning workers exited with codes {codes}", stacklevel=2)
        evaluator = _build_evaluator(problem, rows, device_id, evaluator_factory)
        result = search.tune(
            problem, evaluator, limits=limits, storage=storage, study_name=study,
            settings=settings, incumbent=incumbent, on_trial=_recorder(db, key, study, on_trial),
            progress=not quiet, seeds=seeds,
            default=(running.config if running is not None
                     else family.default(problem, limits, rows)),
        )
        kept = result.kept
        if kept == "default" and running is not None:
            kept = running.source  # the defender was lookup's pick: say where it came from
        metrics = kernel = None
        if result.best is not None and result.timing is not None:
            copy_gbps = float(getattr(evaluator, "copy_gbps", 0.0) or 0.0)
            metrics, kernel = _stored_winner(
                db, key, problem, limits, rows, result, copy_gbps
            )
        return TunedKernel(
            problem=problem, rows=rows, key=key,
            config=result.best if kernel is not None else None,
            timing=result.timing if kernel is not None else None,
            metrics=metrics, kernel=kernel,
            kept=kept, evaluated=result.evaluated,
            failures=result.failures, elapsed_s=time.monotonic() - started,
            study=study, db_path=db.path, failed=failed_candidates(db, key, study),
        )
    finally:
        if evaluator is not None:
            close_evaluator(evaluator)
        if owned:
            db.close()

