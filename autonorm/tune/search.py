"""Search the kernel space of one problem with Optuna, then confirm the winner in finals.

One Optuna study holds every candidate ever measured for one (GPU, family version, problem,
rows bucket). :func:`tune` asks TPE for batches of candidates through the problem's family
(:func:`autonorm.ops.registry.family_of`), drops the invalid ones before anything is compiled,
never measures a configuration twice (across processes and across runs of the same study, so
re-running resumes; :mod:`autonorm.tune.trials` keeps that account), hands the rest to an
:class:`Evaluator` (compile, verify, time: written elsewhere, this module never touches the GPU)
and finally re-times the best few against the current incumbent (docs/tuning.md).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import optuna
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, Trial, TrialState

from autonorm.ops.base import Config, Family, Problem
from autonorm.ops.registry import family_of
from autonorm.results import Outcome, Timing
from autonorm.runtime.limits import DeviceLimits
from autonorm.tune import trials as book
from autonorm.tune.finals import run_finals
from autonorm.tune.progress import ProgressBar
from autonorm.tune.storage import open_storage

__all__ = ["Evaluator", "TuneResult", "TuneSettings", "tune"]

OnTrial = Callable[[Config, Outcome, int], None]


class Evaluator(Protocol):
    """Compiles, verifies and times candidates on one GPU (the search never touches the GPU)."""

    def prepare(self, configs: Sequence[Config]) -> None:
        """Compile ``configs`` ahead, in parallel, so the GPU does not wait on the compiler.

        Never raises: a candidate that fails to compile fails again in :meth:`evaluate`.
        """

    def evaluate(self, config: Config) -> Outcome:
        """Compile if needed, verify against float64, then time ``config``.

        Never raises for a candidate's own failure: returns ``Outcome(status='compile' |
        'launch' | 'verification', error=...)``. KeyboardInterrupt may propagate.
        """

    def retime(self, configs: Sequence[Config], rounds: int) -> list[Timing]:
        """Re-time ``configs`` interleaved (round-robin) ``rounds`` times, in the same order."""


@dataclass(frozen=True)
class TuneSettings:
    """How long and how carefully to search.

    Attributes:
        n_trials: distinct valid candidates to measure in the study (failed ones included,
            earlier runs of the same study included: re-running resumes).
        timeout_s: wall-clock limit of the search in one :func:`tune` call (finals excluded).
        seed: seed of the TPE sampler (single-process runs are reproducible).
        batch: trials asked at once; their valid, new candidates go to ``prepare()`` together.
        finals_top: best distinct candidates of the study re-timed in the finals; 0 skips the
            finals (parallel workers do, and leave them to one final :func:`tune` call).
        finals_rounds: interleaved rounds of the finals.
        noise: smallest relative speed-up that replaces the incumbent; the finals also demand
            more than twice the coefficient of variation of either timing.
        max_idle_asks: stop after this many consecutive asks produced nothing to measure
            (invalid or already measured): the reachable space is exhausted.

    """

    n_trials: int = 40
    timeout_s: float = 45.0
    seed: int = 0
    batch: int = 8
    finals_top: int = 4
    finals_rounds: int = 5
    noise: float = 0.02
    max_idle_asks: int = 200


@dataclass(frozen=True)
class TuneResult:
    """What a tuning run found.

    Attributes:
        best: the finals winner (the search's best when finals are skipped), or None.
        timing: the finals timing of ``best`` (its search timing when finals are skipped).
        kept: the defender no challenger beat clearly, ``"incumbent"`` or ``"default"``; or None.
        evaluated: distinct candidates measured in the study so far (all runs, all workers).
        failures: distinct failed configurations in the study, by failure class.
        elapsed_s: wall-clock seconds of this call, finals included.
        study_name: the Optuna study that holds every trial.

    """

    best: Config | None
    timing: Timing | None
    kept: str | None
    evaluated: int
    failures: dict[str, int]
    elapsed_s: float
    study_name: str


def _sampler_seed(seed: int, worker_index: int | None) -> int:
    """Keep one process reproducible; give parallel workers different proposal sequences."""
    if worker_index is None:
        return seed
    return (seed + 1_000_003 * (worker_index + 1) + os.getpid()) % 2**32


class _Search:
    """The state of one :func:`tune` call: the study, the trials in flight, the clock."""

    def __init__(
        self,
        study: optuna.Study,
        storage: BaseStorage,
        problem: Problem,
        evaluator: Evaluator,
        limits: DeviceLimits,
        settings: TuneSettings,
        on_trial: OnTrial | None,
        progress: ProgressBar,
        target: int,
    ) -> None:
        self.study = study
        # The storage, not the study, can update trials of other (dead) processes.
        self.storage = storage
        self.study_id = storage.get_study_id_from_name(study.study_name)
        self.problem = problem
        self.family: Family = family_of(problem)
        self.evaluator = evaluator
        self.limits = limits
        self.settings = settings
        self.on_trial = on_trial
        self.progress = progress
        self.target = target
        self.me = book.owner_of_this_process()
        self.start = time.monotonic()
        self.in_flight: dict[int, Trial] = {}
        self.measuring: int | None = None
        self.idle = 0
        self.given_up: set[int] = set()

    # -- telling

    def _tell(self, trial: Trial, attrs: dict[str, Any], **kwargs: Any) -> FrozenTrial:
        # Another process may have finished the trial already: a shared study's heartbeat
        # reclaims a trial whose process went quiet too long. It stays as that process left it.
        try:
            for name, value in attrs.items():
                trial.set_user_attr(name, value)
        except optuna.exceptions.UpdateFinishedTrialError:
            kwargs["skip_if_finished"] = True
        frozen = self.study.tell(trial, **kwargs)
        self.in_flight.pop(trial.number, None)
        return frozen

    def _report(self, config: Config, outcome: Outcome, number: int) -> None:
        if self.on_trial is not None:
            self.on_trial(config, outcome, number)

    def abandon(self, exc: BaseException) -> None:
        """Finish the trials in flight after an exception: FAIL, and retried on resume."""
        for number, trial in list(self.in_flight.items()):
            if number == self.measuring:
                attrs = {
                    book.ATTR_ROLE: book.ROLE_EVALUATE,
                    book.ATTR_FAILURE: book.INTERRUPTED,
                    book.ATTR_ERROR: f"{type(exc).__name__}: {exc}"[: book.MAX_ERROR_CHARS],
                }
            else:
                attrs = {book.ATTR_ROLE: book.ROLE_SKIPPED}
            try:
                self._tell(trial, attrs, state=TrialState.FAIL, skip_if_finished=True)
            except Exception:  # noqa: BLE001 - keep cleaning up; the original error is raised
                continue

    # -- the loop

    def out_of_time(self) -> bool:
        return time.monotonic() - self.start >= self.settings.timeout_s

    def refresh(self) -> book.Summary:
        trials = self.study.get_trials(deepcopy=False)
        book.fail_stale_trials(self.storage, self.study_id, trials)
        summary = book.summarize(trials, self.me)
        self.progress.update(summary.evaluated, book.timing_of(summary.best))
        return summary

    def run(self) -> None:
        while True:
            summary = self.refresh()
            if summary.evaluated >= self.target or self.out_of_time():
                return
            if self.idle >= self.settings.max_idle_asks:
                return
            # Leave the candidates other workers are measuring to them, but always ask one,
            # so a worker that died elsewhere cannot stall this one.
            room = self.target - summary.evaluated - summary.in_flight_elsewhere
            self.run_batch(max(1, min(self.settings.batch, room)))

    def ask(self) -> book.Ask:
        trial = self.study.ask()
        self.in_flight[trial.number] = trial
        # Before the parameters: if this process dies now, others can tell the trial is stale.
        trial.set_user_attr(book.ATTR_OWNER, self.me)
        return book.Ask(trial, self.family.suggest(trial))

    def run_batch(self, size: int) -> None:
        asks = [self.ask() for _ in range(size)]
        mine = {a.trial.number for a in asks}
        trials = book.snapshot_when_ready(self.study, mine, self.given_up, self.family)
        book.plan(asks, trials, self.family, self.problem, self.limits)
        to_measure: list[book.Ask] = []
        for ask in asks:
            if ask.action == book.ROLE_EVALUATE:
                ask.trial.set_user_attr(book.ATTR_ROLE, book.ROLE_EVALUATE)
                to_measure.append(ask)
                continue
            if ask.action != "defer":  # settled once its in-batch original is measured
                self.idle += 1
                self.settle_unmeasured(ask)
        results: dict[int, FrozenTrial] = {}
        if to_measure:
            self.evaluator.prepare([a.config for a in to_measure])
        for ask in to_measure:
            if self.out_of_time() or self.refresh().evaluated >= self.target:
                self._tell(ask.trial, {book.ATTR_ROLE: book.ROLE_SKIPPED}, state=TrialState.FAIL)
                continue
            self.measuring = ask.trial.number
            outcome = self.evaluator.evaluate(ask.config)
            results[ask.trial.number] = self.record(ask, outcome)
            self.measuring = None
            self.idle = 0
        for ask in asks:
            if ask.action == "defer":
                self.idle += 1
                ask.prior = results.get(ask.original)  # type: ignore[arg-type]
                self.settle_unmeasured(ask)

    def settle_unmeasured(self, ask: book.Ask) -> None:
        """Tell a trial that is not measured: invalid, or a duplicate of an earlier one."""
        if ask.action == book.ROLE_INVALID:
            error = "; ".join(ask.reasons)
            attrs = {
                book.ATTR_ROLE: book.ROLE_INVALID,
                book.ATTR_FAILURE: "invalid",
                book.ATTR_ERROR: error,
            }
            self._tell(ask.trial, attrs, state=TrialState.PRUNED)
            self._report(ask.config, Outcome(status="invalid", error=error), ask.trial.number)
            return
        prior = ask.prior
        if prior is None or prior.state not in (TrialState.COMPLETE, TrialState.FAIL):
            # Measured elsewhere right now, or the in-batch original was skipped: no signal
            # for the sampler (FAIL is ignored by TPE) and no count; a later ask may retry.
            number = prior.number if prior is not None else ask.original
            self._tell(
                ask.trial,
                {book.ATTR_ROLE: book.ROLE_DUPLICATE, book.ATTR_DUPLICATE_OF: number},
                state=TrialState.FAIL,
            )
            return
        attrs = {book.ATTR_ROLE: book.ROLE_DUPLICATE, book.ATTR_DUPLICATE_OF: prior.number}
        if prior.state == TrialState.COMPLETE:
            if book.ATTR_TIMING in prior.user_attrs:
                attrs[book.ATTR_TIMING] = prior.user_attrs[book.ATTR_TIMING]
            self._tell(ask.trial, attrs, values=prior.value)
        elif prior.user_attrs.get(book.ATTR_FAILURE) in book.FINAL_FAILURES:
            # Pruned, not failed: TPE ranks pruned trials low, steering it away from the config.
            self._tell(ask.trial, attrs, state=TrialState.PRUNED)
        else:
            self._tell(ask.trial, attrs, state=TrialState.FAIL)

    def record(self, ask: book.Ask, outcome: Outcome) -> FrozenTrial:
        """Store one measurement (or its failure) in the study and report it."""
        attrs: dict[str, Any] = {}
        if outcome.max_rel_err is not None:
            attrs[book.ATTR_MAX_REL_ERR] = outcome.max_rel_err
        if outcome.ok:
            attrs[book.ATTR_TIMING] = dataclasses.asdict(outcome.timing)
            frozen = self._tell(ask.trial, attrs, values=outcome.timing.median_us)
        else:
            failure = outcome.status if outcome.status in book.FINAL_FAILURES else "launch"
            error = outcome.error or f"evaluator returned status {outcome.status!r} and no timing"
            attrs[book.ATTR_FAILURE] = failure
            attrs[book.ATTR_ERROR] = error[: book.MAX_ERROR_CHARS]
            frozen = self._tell(ask.trial, attrs, state=TrialState.FAIL)
        self._report(ask.config, outcome, ask.trial.number)
        return frozen


# --------------------------------------------------------------------------- the entry point


def tune(
    problem: Problem,
    evaluator: Evaluator,
    *,
    limits: DeviceLimits,
    storage: BaseStorage | str | None = None,
    study_name: str,
    settings: TuneSettings = TuneSettings(),  # noqa: B008 - frozen, so sharing is safe
    incumbent: Config | None = None,
    on_trial: OnTrial | None = None,
    progress: bool = True,
    worker_index: int | None = None,
    seeds: Sequence[Config] = (),
    default: Config | None = None,
) -> TuneResult:
    """Search the kernel space of ``problem``, then re-time the best against the incumbent.

    Resumable: the study keeps every trial, so calling again with the same storage and study
    continues until ``settings.n_trials`` candidates are measured, without measuring any of them
    again. Several processes may run it on one study at once (see
    :func:`autonorm.tune.workers.run_workers`).

    Args:
        problem: what the kernels compute; its family (by op) owns the search space.
        evaluator: compiles, verifies and times candidates on this process's GPU.
        limits: the device limits that decide validity.
        storage: an Optuna storage, or a URL/path for
            :func:`autonorm.tune.storage.open_storage` (None: the default journal file of the
            study).
        study_name: the study (see :func:`autonorm.tune.storage.study_name_for`).
        settings: budget and finals settings.
        incumbent: the configuration in use now; it stays unless a challenger beats it clearly.
        on_trial: called with (config, outcome, trial number) for every candidate judged:
            invalid ones, measured ones and failures (not for duplicates of earlier trials).
        progress: show a progress bar on stderr.
        worker_index: index of a parallel worker; it gives the sampler a distinct seed.
        seeds: configurations to measure first (enqueued once, when the study is new), e.g.
            the family's ``seeds``.
        default: what runs where no winner is stored; with no incumbent it defends as one
            (:func:`autonorm.tune.finals.run_finals`).

    Returns:
        The finals winner and its timing, and counts over the whole study.

    Raises:
        KeyboardInterrupt: after the trial being measured is recorded as interrupted (it is
            measured again on resume) and the rest of its batch is released.

    """
    started = time.monotonic()
    family = family_of(problem)
    if not isinstance(storage, BaseStorage):
        storage = open_storage(storage, study_name)
    sampler = optuna.samplers.TPESampler(seed=_sampler_seed(settings.seed, worker_index))
    study = optuna.create_study(
        storage=storage,
        study_name=study_name,
        direction="minimize",
        sampler=sampler,
        load_if_exists=True,
    )
    if seeds and worker_index in (None, 0) and not study.get_trials(deepcopy=False):
        for seed_config in seeds:
            study.enqueue_trial(seed_config.to_dict(), skip_if_exists=True)
    # More trials than valid configurations cannot be measured.
    target = min(settings.n_trials, len(family.space(problem, limits)))
    label = f"tuning {family.op} {problem.describe()}"
    with ProgressBar(progress, label, target) as bar:
        search = _Search(
            study, storage, problem, evaluator, limits, settings, on_trial, bar, target
        )
        try:
            search.run()
        except BaseException as exc:
            search.abandon(exc)
            raise
        summary = search.refresh()

    trials = study.get_trials(deepcopy=False)
    if settings.finals_top > 0:
        best, timing, kept = run_finals(
            trials, evaluator, problem, limits, incumbent=incumbent, top=settings.finals_top,
            rounds=settings.finals_rounds, noise=settings.noise, default=default,
        )
    else:
        best = family.config_from_dict(summary.best.params) if summary.best else None
        timing, kept = book.timing_of(summary.best), None
    return TuneResult(
        best=best, timing=timing, kept=kept,
        evaluated=summary.evaluated, failures=summary.failures,
        elapsed_s=time.monotonic() - started, study_name=study_name,
    )
