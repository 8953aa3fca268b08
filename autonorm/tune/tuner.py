"""Search the kernel space of one problem with Optuna, then confirm the winner in finals.

One Optuna study holds every candidate ever measured for one (GPU, autonorm version, dtype,
hidden size, rows bucket, affine flags). :func:`tune` asks TPE for batches of candidates, drops
the invalid ones before anything is compiled, never measures a configuration twice (across
processes and across runs of the same study, so re-running resumes), hands the rest to an
:class:`Evaluator` (compile, verify, time: written elsewhere, this module never touches the GPU)
and finally re-times the best few against the current incumbent.

Every trial the tuner touches carries user attributes that explain it:

* ``owner``: ``{"host", "pid", "start"}`` of the process that asked it. Written after the
  parameters, so a trial with an owner is complete enough for others to compare against, and a
  RUNNING trial whose owner died on this host is stale.
* ``role``: ``evaluate`` (handed to the evaluator), ``invalid`` (rejected by
  :func:`autonorm.space.check`), ``duplicate`` (an earlier trial has, or is measuring, the same
  configuration; see ``duplicate_of``) or ``skipped`` (asked, then not measured because the
  budget or the time ran out).
* ``failure`` and ``error``: the failure class (:data:`autonorm.results.FAILURE_CLASSES`, or
  ``interrupted``) and its message.
* ``timing``: the search :class:`~autonorm.results.Timing` of a measured candidate.
"""

from __future__ import annotations

import dataclasses
import hashlib
import multiprocessing
import os
import re
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Protocol

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, Trial, TrialState

from autonorm import settings as config
from autonorm.ops import layer_norm as space
from autonorm.ops.layer_norm.config import (
    KernelConfig,
)
from autonorm.ops.layer_norm.problem import Problem
from autonorm.results import FAILURE_CLASSES, Outcome, Timing
from autonorm.runtime.limits import DeviceLimits

__all__ = [
    "Evaluator",
    "TuneResult",
    "TuneSettings",
    "open_storage",
    "run_workers",
    "study_name_for",
    "suggest_config",
    "tune",
]

ATTR_OWNER = "owner"

ATTR_ROLE = "role"

ATTR_FAILURE = "failure"

ATTR_ERROR = "error"

ATTR_TIMING = "timing"

ATTR_MAX_REL_ERR = "max_rel_err"

ATTR_DUPLICATE_OF = "duplicate_of"

ROLE_EVALUATE = "evaluate"

ROLE_INVALID = "invalid"

ROLE_DUPLICATE = "duplicate"

ROLE_SKIPPED = "skipped"

# A candidate's own failures are final: measuring it again would fail again and waste GPU time.
# "interrupted" (Ctrl-C, a killed process) says nothing about the candidate, so it is retried.
FINAL_FAILURES = frozenset(FAILURE_CLASSES)

INTERRUPTED = "interrupted"

JOURNAL_SUFFIX = ".journal"

# Asking a trial and writing its parameters and owner takes milliseconds; a RUNNING trial
# without an owner for this long was left behind by a process that died in between.
UNOWNED_GRACE = timedelta(minutes=5)

# How long to wait for a lower-numbered trial of another process to get its parameters before
# deciding without it (bounds the wait if that process died on another host).
READY_WAIT_S = 10.0

READY_POLL_S = 0.02

# Compiler logs can be long; the study keeps the start, which names the error.
MAX_ERROR_CHARS = 4000


class Evaluator(Protocol):
    """Compiles, verifies and times candidates on one GPU (the tuner never touches the GPU)."""

    def prepare(self, configs: Sequence[KernelConfig]) -> None:
        """Compile ``configs`` ahead, in parallel, so the GPU does not wait on NVRTC.

        Never raises: a candidate that fails to compile fails again in :meth:`evaluate`.
        """

    def evaluate(self, config: KernelConfig) -> Outcome:
        """Compile if needed, verify against float64, then time ``config``.

        Never raises for a candidate's own failure: returns ``Outcome(status='compile' |
        'launch' | 'verification', error=...)``. KeyboardInterrupt may propagate.
        """

    def retime(self, configs: Sequence[KernelConfig], rounds: int) -> list[Timing]:
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
        incumbent_kept: True when the incumbent stayed because no challenger beat it clearly.
        evaluated: distinct candidates measured in the study so far (all runs, all workers).
        failures: distinct failed configurations in the study, by failure class.
        elapsed_s: wall-clock seconds of this call, finals included.
        study_name: the Optuna study that holds every trial.

    """

    best: KernelConfig | None
    timing: Timing | None
    incumbent_kept: bool
    evaluated: int
    failures: dict[str, int]
    elapsed_s: float
    study_name: str


def _slug(text: str) -> str:
    """Lower-case ``text`` and keep only characters that are safe in file names."""
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-.")


def study_name_for(
    device_fingerprint: str, version: str, problem: Problem, rows_bucket: int
) -> str:
    """Return the study name of one (GPU, autonorm version, problem, rows bucket).

    The name is readable and safe as a file name, e.g.
    ``nvidia-h200-1a2b3c4d_v0.1.0_bfloat16_h4096_r1024_w1b1``. The hash covers the whole
    fingerprint, because the readable part keeps only the GPU model name.

    Args:
        device_fingerprint: :attr:`autonorm.runtime.device.DeviceInfo.fingerprint`.
        version: the autonorm version (kernels of another version are another study).
        problem: dtype, hidden size and affine flags.
        rows_bucket: :func:`autonorm.space.rows_bucket` of the row count.

    Raises:
        ValueError: ``rows_bucket`` is not a positive integer.

    """
    if not isinstance(rows_bucket, int) or rows_bucket < 1:
        raise ValueError(f"rows_bucket must be a positive integer, got {rows_bucket!r}")
    gpu = _slug(device_fingerprint.split("|", 1)[0])[:40] or "gpu"
    digest = hashlib.sha1(device_fingerprint.encode()).hexdigest()[:8]
    affine = f"w{int(problem.has_weight)}b{int(problem.has_bias)}"
    return (
        f"{gpu}-{digest}_v{_slug(version) or 'unknown'}_{problem.dtype}_h{problem.hidden}"
        f"_r{rows_bucket}_{affine}"
    )


def _scheme(url: str) -> str:
    """Return the URL scheme without a driver suffix (``postgresql+psycopg2`` -> postgresql)."""
    if "://" not in url:
        return ""
    return url.split("://", 1)[0].lower().split("+", 1)[0]


def _study_file(folder: Path, study_name: str) -> Path:
    """Return the journal file of a study inside ``folder``."""
    return folder / (re.sub(r"[^A-Za-z0-9._-]+", "_", study_name) + JOURNAL_SUFFIX)


def _journal_file(path: Path) -> JournalStorage:
    """Open (creating it and its folder) a journal file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(str(path)))


def _journal_at(location: str, study_name: str) -> JournalStorage:
    """Open the journal file at ``location``; a directory gets one file per study inside it."""
    path = Path(location).expanduser()
    if path.is_dir() or location.endswith(("/", os.sep)):
        path = _study_file(path, study_name)
    return _journal_file(path)


def open_storage(url: str | None, study_name: str) -> BaseStorage:
    """Open the Optuna storage named by ``url``.

    Args:
        url: where studies live.

            * None: a journal file ``<studies_dir>/<study_name>.journal``.
            * a path, or ``journal:///abs/path``: a journal file there (a directory gets
              ``<study_name>.journal`` inside it). Many local processes may share one.
            * ``redis://...``: Optuna's Redis journal backend (needs ``pip install redis``);
              for workers on several machines.
            * ``postgresql://...``, ``mysql://...``: an Optuna RDB storage.
            * ``sqlite:///...``: an RDB storage for one worker only (see :func:`run_workers`).
        study_name: the study that will be opened in it (names the default journal file).

    Raises:
        ImportError: a Redis URL without the redis package installed.
        ValueError: an unsupported URL scheme.

    """
    if url is None:
        return _journal_file(_study_file(config.studies_dir(), study_name))
    scheme = _scheme(url)
    if scheme == "":
        return _journal_at(url, study_name)
    if scheme == "journal":
        return _journal_at(url.split("://", 1)[1], study_name)
    if scheme in ("redis", "rediss", "unix"):
        # Imported here: redis is optional, and only multi-machine tuning needs it.
        try:
            import redis  # noqa: F401
        except ImportError as exc:
            raise ImportError(
                f"storage {url!r} needs the redis package: pip install redis "
                "(or use a journal file shared by the local processes)"
            ) from exc
        from optuna.storages.journal import JournalRedisBackend

        return JournalStorage(JournalRedisBackend(url))
    if scheme in ("postgresql", "postgres", "mysql", "sqlite"):
        return RDBStorage(url)
    raise ValueError(
        f"unsupported storage URL {url!r}: use a journal file path, journal:///path, "
        "redis://, postgresql://, mysql:// or (one worker only) sqlite:///"
    )


def suggest_config(trial: Trial) -> KernelConfig:
    """Ask ``trial`` for one point of the template family (parameters named as the fields).

    The bulk-copy kernel fixes its statistics (two-pass), grid and registers (occupancy) and
    alone takes ``stages``: those parameters are asked conditionally, so no ask is spent on
    combinations that cannot exist.
    """
    threads = trial.suggest_categorical("threads", space.THREADS)
    vec = trial.suggest_categorical("vec", space.VECS)
    rows_per_block = trial.suggest_categorical("rows_per_block", space.ROWS_PER_BLOCK)
    cache = trial.suggest_categorical("cache", space.CACHES)
    cluster = trial.suggest_categorical("cluster", space.CLUSTERS)
    keep_x = trial.suggest_categorical("keep_x", (False, True))
    if cache == "bulk":
        stages = trial.suggest_categorical("stages", space.STAGES[1:])
        return KernelConfig(
            threads=threads, vec=vec, rows_per_block=rows_per_block, cache=cache,
            cluster=cluster, stages=stages, keep_x=keep_x,
            **space.BULK_FIXED,  # type: ignore[arg-type]
        )
    return KernelConfig(
        threads=threads,
        vec=vec,
        rows_per_block=rows_per_block,
        cache=cache,
        stats=trial.suggest_categorical("stats", space.STATS),
        cluster=cluster,
        blocks_per_sm=trial.suggest_categorical("blocks_per_sm", space.BLOCKS_PER_SM),
        max_regs=trial.suggest_categorical("max_regs", space.MAX_REGS),
        keep_x=keep_x,
    )


def _key(params: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Return a hashable identity of a configuration's parameters."""
    return tuple(sorted(params.items()))


def _proc_stat(pid: int) -> tuple[str, str] | None:
    """Return (state, start time in clock ticks) of a Linux process, or None if unknown."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
        fields = text.rpartition(")")[2].split()
        return fields[0], fields[19]
    except (OSError, IndexError):
        return None


def _owner_of_this_process() -> dict[str, Any]:
    """Describe this process, so others can tell whether its RUNNING trials are alive."""
    pid = os.getpid()
    stat = _proc_stat(pid)
    return {"host": socket.gethostname(), "pid": pid, "start": stat[1] if stat else None}


def _owner_alive(owner: dict[str, Any]) -> bool:
    """Return False only when the owner is known to be dead (it runs on this host)."""
    if owner.get("host") != socket.gethostname():
        return True  # another machine: its processes cannot be inspected from here
    pid = owner.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    stat = _proc_stat(pid)
    if stat is not None:
        state, start = stat
        # A zombie has died; a different start time means the pid was reused.
        return state not in ("Z", "X") and owner.get("start") in (None, start)
    if os.name == "nt":
        return True  # os.kill(pid, 0) would terminate the process on Windows
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stale_reason(trial: FrozenTrial) -> str | None:
    """Say why a RUNNING trial was left behind by a dead process, or None if it may be alive."""
    owner = trial.user_attrs.get(ATTR_OWNER)
    if owner is None:
        started = trial.datetime_start
        if started is None:
            return None
        now = datetime.now(timezone.utc) if started.tzinfo else datetime.now()
        if now - started > UNOWNED_GRACE:
            return "asked but never set up: its process died"
        return None
    if _owner_alive(owner):
        return None
    return f"process {owner.get('pid')} on {owner.get('host')} died while evaluating"


def _fail_stale_trials(storage: BaseStorage, study_id: int, trials: Sequence[FrozenTrial]) -> None:
    """Mark RUNNING trials of dead processes FAIL/interrupted, so their configs are retried."""
    for trial in trials:
        if trial.state != TrialState.RUNNING:
            continue
        reason = _stale_reason(trial)
        if reason is None:
            continue
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
        try:
            storage.set_trial_user_attr(trial_id, ATTR_FAILURE, INTERRUPTED)
            storage.set_trial_user_attr(trial_id, ATTR_ERROR, f"stale: {reason}")
            storage.set_trial_state_values(trial_id, TrialState.FAIL)
        except UpdateFinishedTrialError:
            pass  # another process marked it first


def _is_measured(trial: FrozenTrial) -> bool:
    """Return True if the evaluator measured the trial's candidate (success or final failure)."""
    if trial.user_attrs.get(ATTR_ROLE) != ROLE_EVALUATE:
        return False
    if trial.state == TrialState.COMPLETE:
        return True
    return trial.state == TrialState.FAIL and trial.user_attrs.get(ATTR_FAILURE) in FINAL_FAILURES


@dataclass
class _Summary:
    """What the study holds, recomputed from its trials."""

    evaluated: int = 0
    in_flight_elsewhere: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    best: FrozenTrial | None = None


def _summarize(trials: Sequence[FrozenTrial], me: dict[str, Any]) -> _Summary:
    """Count measured candidates, failures by class, trials measured elsewhere, and the best."""
    measured: set[tuple] = set()
    failed: dict[str, set[tuple]] = {name: set() for name in FAILURE_CLASSES}
    summary = _Summary()
    for trial in trials:
        key = _key(trial.params)
        if _is_measured(trial):
            measured.add(key)
        failure = trial.user_attrs.get(ATTR_FAILURE)
        if failure in failed:
            failed[failure].add(key)
        if trial.state == TrialState.COMPLETE and trial.value is not None:
            if summary.best is None or trial.value < summary.best.value:
                summary.best = trial
        elif trial.state == TrialState.RUNNING:
            owner = trial.user_attrs.get(ATTR_OWNER)
            if (
                owner is not None
                and owner != me
                and trial.user_attrs.get(ATTR_ROLE) in (None, ROLE_EVALUATE)
                and _owner_alive(owner)
            ):
                summary.in_flight_elsewhere += 1
    summary.evaluated = len(measured)
    summary.failures = {name: len(keys) for name, keys in failed.items()}
    return summary


def _timing_of(trial: FrozenTrial | None) -> Timing | None:
    """Return the search timing stored on a completed trial."""
    if trial is None or ATTR_TIMING not in trial.user_attrs:
        return None
    return Timing(**trial.user_attrs[ATTR_TIMING])


@dataclass
class _Ask:
    """One asked trial and what to do with it."""

    trial: Trial
    config: KernelConfig
    action: str = ROLE_EVALUATE  # evaluate | invalid | copy | failed | elsewhere | defer
    reasons: list[str] = field(default_factory=list)
    prior: FrozenTrial | None = None
    original: int | None = None  # in-batch trial number a deferred duplicate waits for

_COMMON_PARAMS = frozenset({"threads", "vec", "rows_per_block", "cache", "cluster", "keep_x"})

_BULK_PARAMS = _COMMON_PARAMS | {"stages"}

_OTHER_PARAMS = _COMMON_PARAMS | set(space.BULK_FIXED)


def _has_all_params(trial: FrozenTrial) -> bool:
    """Return True once :func:`suggest_config` has written every parameter of the trial."""
    params = trial.params
    if "cache" not in params:
        return False
    need = _BULK_PARAMS if params["cache"] == "bulk" else _OTHER_PARAMS
    return need.issubset(params)


def _snapshot_when_ready(
    study: optuna.Study, mine: set[int], given_up: set[int]
) -> list[FrozenTrial]:
    """Return the study's trials once every lower-numbered trial has all its parameters.

    Without this, two processes proposing the same configuration at once could both measure
    it: the higher-numbered one may compare before the lower-numbered one has written its
    parameters. Trials that stay incomplete past :data:`READY_WAIT_S` (their process died on
    another host) are added to ``given_up`` and not waited for again.
    """
    highest = max(mine)
    deadline = time.monotonic() + READY_WAIT_S
    while True:
        trials = study.get_trials(deepcopy=False)
        pending = [
            t.number
            for t in trials
            if t.number < highest
            and t.number not in mine
            and t.number not in given_up
            and t.state == TrialState.RUNNING
            and not _has_all_params(t)
            and _stale_reason(t) is None
        ]
        if not pending:
            return trials
        if time.monotonic() > deadline:
            given_up.update(pending)
            return trials
        time.sleep(READY_POLL_S)


def _plan(
    asks: list[_Ask], trials: Sequence[FrozenTrial], problem: Problem, limits: DeviceLimits
) -> None:
    """Decide for each asked trial: invalid, copy/failed (measured before), or measure it.

    A configuration is measured at most once per study: a finished measurement of any trial
    number is reused (a final failure is not retried); a RUNNING one in a live process is
    honoured only if its number is lower, so of two processes proposing the same
    configuration at once exactly one measures it.
    """
    by_number = sorted(trials, key=lambda t: t.number)
    mine = {a.trial.number for a in asks}
    for ask in asks:
        ask.reasons = space.check(ask.config, problem, limits)
        if ask.reasons:
            ask.action = ROLE_INVALID
            continue
        params = ask.trial.params
        complete = failed = running = None
        for other in by_number:
            if other.number == ask.trial.number or other.params != params:
                continue
            failure = other.user_attrs.get(ATTR_FAILURE)
            if other.state == TrialState.COMPLETE and complete is None:
                complete = other
            elif other.state == TrialState.FAIL and failure in FINAL_FAILURES and failed is None:
                failed = other
            elif (
                other.state == TrialState.RUNNING
                and other.number < ask.trial.number
                and running is None
                and other.user_attrs.get(ATTR_ROLE) in (None, ROLE_EVALUATE)
                and ATTR_OWNER in other.user_attrs
                and _owner_alive(other.user_attrs[ATTR_OWNER])
            ):
                running = other
        if complete is not None:
            ask.action, ask.prior = "copy", complete
        elif failed is not None:
            ask.action, ask.prior = "failed", failed
        elif running is not None and running.number in mine:
            ask.action, ask.original = "defer", running.number
        elif running is not None:
            ask.action, ask.prior = "elsewhere", running


class _Progress:
    """A rich progress bar on stderr (trials done / n_trials, best GB/s, share of copy)."""

    def __init__(self, enabled: bool, description: str, total: int) -> None:
        self._bar = None
        self._task = None
        if enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            # stderr: stdout stays clean for the CLI's machine-readable output.
            self._bar = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[best]}"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
            )
            self._task = self._bar.add_task(description, total=max(total, 1), best="")

    def __enter__(self) -> _Progress:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def update(self, done: int, best: Timing | None) -> None:
        """Show ``done`` trials and the best timing so far."""
        if self._bar is None:
            return
        text = ""
        if best is not None:
            text = f"best {best.median_us:.2f} us"
            if best.gbps > 0:
                text += f", {best.gbps:.0f} GB/s"
            if best.share > 0:
                text += f" ({100 * best.share:.0f}% of copy)"
        self._bar.update(self._task, completed=done, best=text)


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
        on_trial: Callable[[KernelConfig, Outcome, int], None] | None,
        progress: _Progress,
        target: int,
    ) -> None:
        self.study = study
        # The storage, not the study, can update trials of other (dead) processes.
        self.storage = storage
        self.study_id = storage.get_study_id_from_name(study.study_name)
        self.problem = problem
        self.evaluator = evaluator
        self.limits = limits
        self.settings = settings
        self.on_trial = on_trial
        self.progress = progress
        self.target = target
        self.me = _owner_of_this_process()
        self.start = time.monotonic()
        self.in_flight: dict[int, Trial] = {}
        self.measuring: int | None = None
        self.idle = 0
        self.given_up: set[int] = set()

    # -- telling

    def _tell(self, trial: Trial, attrs: dict[str, Any], **kwargs: Any) -> FrozenTrial:
        for name, value in attrs.items():
            trial.set_user_attr(name, value)
        frozen = self.study.tell(trial, **kwargs)
        self.in_flight.pop(trial.number, None)
        return frozen

    def _report(self, config: KernelConfig, outcome: Outcome, number: int) -> None:
        if self.on_trial is not None:
            self.on_trial(config, outcome, number)

    def abandon(self, exc: BaseException) -> None:
        """Finish the trials in flight after an exception: FAIL, and retried on resume."""
        for number, trial in list(self.in_flight.items()):
            if number == self.measuring:
                attrs = {
                    ATTR_ROLE: ROLE_EVALUATE,
                    ATTR_FAILURE: INTERRUPTED,
                    ATTR_ERROR: f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS],
                }
            else:
                attrs = {ATTR_ROLE: ROLE_SKIPPED}
            try:
                self._tell(trial, attrs, state=TrialState.FAIL, skip_if_finished=True)
            except Exception:  # noqa: BLE001 - keep cleaning up; the original error is raised
                continue

    # -- the loop

    def out_of_time(self) -> bool:
        return time.monotonic() - self.start >= self.settings.timeout_s

    def refresh(self) -> _Summary:
        trials = self.study.get_trials(deepcopy=False)
        _fail_stale_trials(self.storage, self.study_id, trials)
        summary = _summarize(trials, self.me)
        self.progress.update(summary.evaluated, _timing_of(summary.best))
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

    def ask(self) -> _Ask:
        trial = self.study.ask()
        self.in_flight[trial.number] = trial
        # Before the parameters: if this process dies now, others can tell the trial is stale.
        trial.set_user_attr(ATTR_OWNER, self.me)
        return _Ask(trial, suggest_config(trial))

    def run_batch(self, size: int) -> None:
        asks = [self.ask() for _ in range(size)]
        trials = _snapshot_when_ready(self.study, {a.trial.number for a in asks}, self.given_up)
        _plan(asks, trials, self.problem, self.limits)
        to_measure: list[_Ask] = []
        for ask in asks:
            if ask.action == ROLE_EVALUATE:
                ask.trial.set_user_attr(ATTR_ROLE, ROLE_EVALUATE)
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
                self._tell(ask.trial, {ATTR_ROLE: ROLE_SKIPPED}, state=TrialState.FAIL)
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

    def settle_unmeasured(self, ask: _Ask) -> None:
        """Tell a trial that is not measured: invalid, or a duplicate of an earlier one."""
        if ask.action == ROLE_INVALID:
            error = "; ".join(ask.reasons)
            attrs = {ATTR_ROLE: ROLE_INVALID, ATTR_FAILURE: "invalid", ATTR_ERROR: error}
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
                {ATTR_ROLE: ROLE_DUPLICATE, ATTR_DUPLICATE_OF: number},
                state=TrialState.FAIL,
            )
            return
        attrs = {ATTR_ROLE: ROLE_DUPLICATE, ATTR_DUPLICATE_OF: prior.number}
        if prior.state == TrialState.COMPLETE:
            if ATTR_TIMING in prior.user_attrs:
                attrs[ATTR_TIMING] = prior.user_attrs[ATTR_TIMING]
            self._tell(ask.trial, attrs, values=prior.value)
        elif prior.user_attrs.get(ATTR_FAILURE) in FINAL_FAILURES:
            # Pruned, not failed: TPE ranks pruned trials low, steering it away from the config.
            self._tell(ask.trial, attrs, state=TrialState.PRUNED)
        else:
            self._tell(ask.trial, attrs, state=TrialState.FAIL)

    def record(self, ask: _Ask, outcome: Outcome) -> FrozenTrial:
        """Store one measurement (or its failure) in the study and report it."""
        attrs: dict[str, Any] = {}
        if outcome.max_rel_err is not None:
            attrs[ATTR_MAX_REL_ERR] = outcome.max_rel_err
        if outcome.ok:
            attrs[ATTR_TIMING] = dataclasses.asdict(outcome.timing)
            frozen = self._tell(ask.trial, attrs, values=outcome.timing.median_us)
        else:
            failure = outcome.status if outcome.status in FINAL_FAILURES else "launch"
            error = outcome.error or f"evaluator returned status {outcome.status!r} and no timing"
            attrs.update({ATTR_FAILURE: failure, ATTR_ERROR: error[:MAX_ERROR_CHARS]})
            frozen = self._tell(ask.trial, attrs, state=TrialState.FAIL)
        self._report(ask.config, outcome, ask.trial.number)
        return frozen


def _ranked_configs(trials: Sequence[FrozenTrial]) -> list[KernelConfig]:
    """Return the distinct completed configurations of the study, fastest first."""
    done = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None]
    seen: set[tuple] = set()
    ranked = []
    for trial in sorted(done, key=lambda t: (t.value, t.number)):
        key = _key(trial.params)
        if key not in seen:
            seen.add(key)
            ranked.append(KernelConfig.from_dict(trial.params))
    return ranked


def _beats(challenger: Timing, incumbent: Timing, noise: float) -> bool:
    """Return True if ``challenger`` is faster by more than the noise of either timing."""
    margin = max(noise, 2 * incumbent.cv, 2 * challenger.cv)
    return (incumbent.median_us - challenger.median_us) / incumbent.median_us > margin


def _run_finals(
    trials: Sequence[FrozenTrial],
    evaluator: Evaluator,
    problem: Problem,
    limits: DeviceLimits,
    settings: TuneSettings,
    incumbent: KernelConfig | None,
) -> tuple[KernelConfig | None, Timing | None, bool]:
    """Re-time the best candidates and the incumbent together; return (best, timing, kept)."""
    if incumbent is not None and space.check(incumbent, problem, limits):
        incumbent = None  # it cannot run this problem any more: nothing to defend
    challengers = [
        c for c in _ranked_configs(trials) if c != incumbent and not space.check(c, problem, limits)
    ][: settings.finals_top]
    contenders = ([incumbent] if incumbent is not None else []) + challengers
    if not contenders:
        return None, None, False
    timings = evaluator.retime(contenders, settings.finals_rounds)
    timed = dict(zip(contenders, timings, strict=True))
    if not challengers:
        return incumbent, timed[incumbent], True
    fastest = min(challengers, key=lambda c: timed[c].median_us)
    if incumbent is None:
        return fastest, timed[fastest], False
    if _beats(timed[fastest], timed[incumbent], settings.noise):
        return fastest, timed[fastest], False
    return incumbent, timed[incumbent], True


def tune(
    problem: Problem,
    evaluator: Evaluator,
    *,
    limits: DeviceLimits,
    storage: BaseStorage | str | None = None,
    study_name: str,
    settings: TuneSettings = TuneSettings(),  # noqa: B008 - frozen, so sharing is safe
    incumbent: KernelConfig | None = None,
    on_trial: Callable[[KernelConfig, Outcome, int], None] | None = None,
    progress: bool = True,
    worker_index: int | None = None,
    seeds: Sequence[KernelConfig] = (),
) -> TuneResult:
    """Search the kernel space of ``problem``, then re-time the best against the incumbent.

    Resumable: the study keeps every trial, so calling again with the same storage and study
    continues until ``settings.n_trials`` candidates are measured, without measuring any of them
    again. Several processes may run it on one study at once (see :func:`run_workers`).

    Args:
        problem: what the kernels normalize.
        evaluator: compiles, verifies and times candidates on this process's GPU.
        limits: the device limits that decide validity.
        storage: an Optuna storage, or a URL/path for :func:`open_storage` (None: the default
            journal file of the study).
        study_name: the study (see :func:`study_name_for`).
        settings: budget and finals settings.
        incumbent: the configuration in use now; it stays unless a challenger beats it clearly.
        on_trial: called with (config, outcome, trial number) for every candidate judged:
            invalid ones, measured ones and failures (not for duplicates of earlier trials).
        progress: show a progress bar on stderr.
        worker_index: index of a parallel worker; it gives the sampler a distinct seed.
        seeds: configurations to measure first (enqueued once, when the study is new), e.g.
            :func:`autonorm.space.seed_configs`.

    Returns:
        The finals winner and its timing, and counts over the whole study.

    Raises:
        KeyboardInterrupt: after the trial being measured is recorded as interrupted (it is
            measured again on resume) and the rest of its batch is released.

    """
    started = time.monotonic()
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
    target = min(settings.n_trials, len(space.enumerate_space(problem, limits)))
    label = f"tuning h{problem.hidden} {problem.dtype}"
    with _Progress(progress, label, target) as bar:
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
        best, timing, kept = _run_finals(trials, evaluator, problem, limits, settings, incumbent)
    else:
        best = KernelConfig.from_dict(summary.best.params) if summary.best else None
        timing, kept = _timing_of(summary.best), False
    return TuneResult(
        best=best,
        timing=timing,
        incumbent_kept=kept,
        evaluated=summary.evaluated,
        failures=summary.failures,
        elapsed_s=time.monotonic() - started,
        study_name=study_name,
    )


@contextmanager
def _environment(name: str, value: str) -> Iterator[None]:
    """Set an environment variable for the duration (children started inside inherit it)."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def _child_visible_devices(gpu: int | str) -> str:
    """Map a GPU index as this process sees it to a CUDA_VISIBLE_DEVICES value for a child."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        # The parent is already restricted: index into its list, not the physical ordinals.
        ids = [part.strip() for part in visible.split(",") if part.strip()]
        if isinstance(gpu, int) and 0 <= gpu < len(ids):
            return ids[gpu]
    return str(gpu)


def run_workers(
    n_workers: int,
    target: Callable[..., object],
    args: tuple,
    *,
    storage_url: str | None,
    gpus: Sequence[int] | None = None,
) -> list[int]:
    """Run ``target(worker_index, *args)`` in one process per GPU and wait for them.

    Each child is started (spawn, never fork: CUDA does not survive a fork) with
    CUDA_VISIBLE_DEVICES naming its GPU, so the variable is set before the child imports
    anything. ``target`` must be a module-level function and usually calls :func:`tune` with
    ``worker_index`` and ``TuneSettings(finals_top=0)`` on the shared study; one more
    :func:`tune` call afterwards runs the finals once.

    Args:
        n_workers: number of processes.
        target: picklable callable, run as ``target(worker_index, *args)``.
        args: further picklable arguments.
        storage_url: the storage the workers share (checked here: SQLite is refused).
        gpus: GPU index of each worker, as this process sees them; workers beyond the list
            reuse it round-robin. None: GPUs 0..n_workers-1.

    Returns:
        The exit code of each worker, in worker order.

    Raises:
        ValueError: no workers or GPUs, or SQLite shared by several workers.

    """
    if n_workers < 1:
        raise ValueError(f"n_workers must be at least 1, got {n_workers}")
    if n_workers > 1 and storage_url is not None and _scheme(storage_url) == "sqlite":
        raise ValueError(
            f"SQLite storage {storage_url!r} cannot be shared by {n_workers} workers: Optuna "
            "advises against SQLite for parallel optimization (locking errors, lost updates). "
            "Use a journal file instead, e.g. a plain path such as ~/autonorm-study.journal "
            "(or journal:///abs/path), or redis:// across machines."
        )
    gpu_ids = list(gpus) if gpus is not None else list(range(n_workers))
    if not gpu_ids:
        raise ValueError("gpus must name at least one GPU")
    context = multiprocessing.get_context("spawn")
    workers = []
    for index in range(n_workers):
        visible = _child_visible_devices(gpu_ids[index % len(gpu_ids)])
        with _environment("CUDA_VISIBLE_DEVICES", visible):
            worker = context.Process(
                target=target, args=(index, *args), name=f"autonorm-tune-{index}"
            )
            worker.start()
        workers.append(worker)
    try:
        for worker in workers:
            worker.join()
    except KeyboardInterrupt:
        # The children got the SIGINT too; let them record their interrupted trials.
        for worker in workers:
            worker.join(timeout=10)
        for worker in workers:
            if worker.is_alive():
                worker.terminate()
        raise
    return [worker.exitcode if worker.exitcode is not None else -1 for worker in workers]
