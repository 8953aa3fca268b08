"""Where Optuna studies live: study names, journal files and storage URLs.

A study is a cache of measurements of one problem on one GPU with one version of its family's
templates (docs/tuning.md). Its name says all of that in a form that is readable and safe as a
file name, because the default storage is one journal file per study.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from optuna.exceptions import ExperimentalWarning, UpdateFinishedTrialError
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, TrialState

from autonorm import settings
from autonorm.ops.base import Problem
from autonorm.tune import trials as book

__all__ = [
    "HEARTBEAT_GRACE_S",
    "HEARTBEAT_S",
    "JOURNAL_SUFFIX",
    "HeartbeatStorage",
    "open_storage",
    "storage_scheme",
    "study_name_for",
]

JOURNAL_SUFFIX = ".journal"

# A tuning process beats for its RUNNING trials this often. A trial whose last beat (by the
# database server's clock) is older than the grace period lost its process, on whatever machine:
# a compile or a finals round never stops the beat, which comes from its own thread.
HEARTBEAT_S = 20
HEARTBEAT_GRACE_S = 120

# The search asks and tells instead of running Study.optimize; the storage beats for it.
_ASK_WARNING = "Heartbeat of storage is supposed to be used with Study.optimize"

# The readable part of a name keeps the GPU model only; the digest covers the whole fingerprint.
_MAX_GPU_CHARS = 40


def _slug(text: str) -> str:
    """Lower-case ``text`` and keep only characters that are safe in file names."""
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-.")


def _field_part(name: str, value: Any) -> str:
    """Write one problem field for a study name: ``name1``/``name0`` for flags, else name-value."""
    if isinstance(value, bool):
        return f"{_slug(name)}{int(value)}"
    return f"{_slug(name)}-{_slug(str(value)) or 'none'}"


def study_name_for(
    device_fingerprint: str, version: str, problem: Problem, rows_bucket: int
) -> str:
    """Return the study name of one (GPU, family version, problem, rows bucket).

    The name is readable and safe as a file name: the GPU model and a hash of its whole
    fingerprint (``nvidia-h200-1a2b3c4d``), the version, the op, the dtype and hidden size
    every problem has, the problem's other fields by name, and the rows bucket, e.g.
    ``<gpu>-<hash>_v<version>_layer-norm_bfloat16_h4096_has-bias1_has-weight1_r1024``.

    Args:
        device_fingerprint: :attr:`autonorm.runtime.device.DeviceInfo.fingerprint`.
        version: the family's :meth:`~autonorm.ops.base.Family.code_version` (kernels of other
            templates are another study).
        problem: what is tuned (its op and :meth:`~autonorm.ops.base.Problem.fields`).
        rows_bucket: :func:`autonorm.ops.base.rows_bucket` of the row count.

    Raises:
        ValueError: ``rows_bucket`` is not a positive integer.

    """
    if not isinstance(rows_bucket, int) or rows_bucket < 1:
        raise ValueError(f"rows_bucket must be a positive integer, got {rows_bucket!r}")
    gpu = _slug(device_fingerprint.split("|", 1)[0])[:_MAX_GPU_CHARS] or "gpu"
    digest = hashlib.sha1(device_fingerprint.encode()).hexdigest()[:8]
    fields = problem.fields()
    others = [_field_part(k, fields[k]) for k in sorted(fields) if k not in ("dtype", "hidden")]
    parts = [
        f"{gpu}-{digest}",
        f"v{_slug(version) or 'unknown'}",
        _slug(type(problem).op),
        _slug(str(problem.dtype)),
        f"h{problem.hidden}",
        *others,
        f"r{rows_bucket}",
    ]
    return "_".join(parts)


def storage_scheme(url: str) -> str:
    """Return a URL's scheme without a driver suffix (``postgresql+psycopg2`` -> postgresql).

    A plain path has none (``""``).
    """
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


class HeartbeatStorage(RDBStorage):
    """An Optuna RDB storage whose trials beat while their process lives.

    Optuna records heartbeats only inside ``Study.optimize``; the search asks and tells
    (:func:`autonorm.tune.search.tune`), so this storage beats itself: every trial it creates
    beats at once and then every ``heartbeat_s`` seconds from one daemon thread, until the trial
    is finished (an enqueued trial from when a process takes it). Reading a study's trials first
    reclaims, at most once a beat, the RUNNING trials whose beat stopped: they fail as
    ``interrupted`` and their configurations may be measured again, like a trial of a killed
    process on this host (:func:`autonorm.tune.trials.stale_reason`). The owner check sees only
    processes of this host; the beat reaches every machine that shares the server.

    Args:
        url: an SQLAlchemy URL (``postgresql://...``, ``mysql://...``).
        heartbeat_s: seconds between beats.
        grace_s: seconds without a beat after which a RUNNING trial is reclaimed.

    """

    def __init__(self, url: str, *, heartbeat_s: int, grace_s: int) -> None:
        if heartbeat_s < 1 or grace_s <= heartbeat_s:
            raise ValueError(
                f"heartbeat_s must be at least 1 and grace_s above it, got {heartbeat_s}, {grace_s}"
            )
        warnings.filterwarnings("ignore", message=_ASK_WARNING)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ExperimentalWarning)
            super().__init__(url, heartbeat_interval=heartbeat_s, grace_period=grace_s)
        self._beating: set[int] = set()
        self._lock = threading.Lock()
        self._beater: threading.Thread | None = None
        self._reclaimed_at: dict[int, float] = {}

    def __getstate__(self) -> dict[Any, Any]:
        state = super().__getstate__()
        for name in ("_beating", "_lock", "_beater", "_reclaimed_at"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[Any, Any]) -> None:
        super().__setstate__(state)
        self._beating, self._lock, self._beater = set(), threading.Lock(), None
        self._reclaimed_at = {}

    def _create_new_trial(self, study_id: int, template_trial: Any = None) -> FrozenTrial:
        """Create a trial; a RUNNING one beats until it is finished (an enqueued one waits)."""
        trial = super()._create_new_trial(study_id, template_trial)
        if trial.state == TrialState.RUNNING:
            self._start_beating(trial._trial_id)
        return trial

    def set_trial_state_values(
        self, trial_id: int, state: TrialState, values: Any = None
    ) -> bool:
        """Set a trial's state: a trial taken from the queue beats, a finished one stops."""
        try:
            changed = super().set_trial_state_values(trial_id, state, values)
        finally:
            if state.is_finished():
                with self._lock:
                    self._beating.discard(trial_id)
        if changed and state == TrialState.RUNNING:
            self._start_beating(trial_id)
        return changed

    def _get_trials(
        self,
        study_id: int,
        states: Any,
        included_trial_ids: set[int],
        trial_id_greater_than: int,
    ) -> list[FrozenTrial]:
        """Read a study's trials after reclaiming, at most once a beat, those whose beat stopped."""
        now = time.monotonic()
        if now - self._reclaimed_at.get(study_id, -float("inf")) >= self.heartbeat_interval:
            self._reclaimed_at[study_id] = now
            self.reclaim_stale_trials(study_id)
        return super()._get_trials(study_id, states, included_trial_ids, trial_id_greater_than)

    def reclaim_stale_trials(self, study_id: int) -> list[int]:
        """Fail the study's RUNNING trials whose beat stopped; return their ids."""
        reclaimed = []
        for trial_id in self._get_stale_trial_ids(study_id):
            try:
                # The reason first: a finished trial takes no more attributes.
                self.set_trial_user_attr(trial_id, book.ATTR_FAILURE, book.INTERRUPTED)
                self.set_trial_user_attr(
                    trial_id, book.ATTR_ERROR,
                    f"stale: no heartbeat for {self.grace_period} s, its process died",
                )
                self.set_trial_state_values(trial_id, TrialState.FAIL)
            except UpdateFinishedTrialError:
                continue  # finished meanwhile, or reclaimed by another process
            reclaimed.append(trial_id)
        return reclaimed

    def _start_beating(self, trial_id: int) -> None:
        """Beat for a RUNNING trial now (one that never beat is never reclaimed), then on."""
        self.record_heartbeat(trial_id)
        with self._lock:
            self._beating.add(trial_id)
            if self._beater is None or not self._beater.is_alive():
                self._beater = threading.Thread(
                    target=self._beat, name="autonorm-heartbeat", daemon=True
                )
                self._beater.start()

    def _beat(self) -> None:
        """Beat for this process's unfinished trials until there are none."""
        while True:
            time.sleep(self.heartbeat_interval)
            with self._lock:
                beating = sorted(self._beating)
                if not beating:
                    self._beater = None
                    return
            for trial_id in beating:
                try:
                    self.record_heartbeat(trial_id)
                except Exception:  # noqa: BLE001 - a lost connection must not end the beat
                    continue


def open_storage(
    url: str | None,
    study_name: str,
    *,
    heartbeat_s: int = HEARTBEAT_S,
    grace_s: int = HEARTBEAT_GRACE_S,
) -> BaseStorage:
    """Open the Optuna storage named by ``url``.

    Args:
        url: where studies live.

            * None: a journal file ``<studies_dir>/<study_name>.journal``.
            * a path, or ``journal:///abs/path``: a journal file there (a directory gets
              ``<study_name>.journal`` inside it). Many local processes may share one.
            * ``redis://...``: Optuna's Redis journal backend (needs ``pip install redis``);
              for workers on several machines.
            * ``postgresql://...``, ``mysql://...``: an Optuna RDB storage whose trials beat
              (:class:`HeartbeatStorage`); for workers on several machines.
            * ``sqlite:///...``: an RDB storage for one worker only (see
              :func:`autonorm.tune.workers.run_workers`).
        study_name: the study that will be opened in it (names the default journal file).
        heartbeat_s: seconds between a PostgreSQL or MySQL storage's beats.
        grace_s: seconds without a beat after which such a storage reclaims a RUNNING trial.

    Raises:
        ImportError: a Redis URL without the redis package installed.
        ValueError: an unsupported URL scheme.

    """
    if url is None:
        return _journal_file(_study_file(settings.studies_dir(), study_name))
    scheme = storage_scheme(url)
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
    if scheme in ("postgresql", "postgres", "mysql"):
        return HeartbeatStorage(url, heartbeat_s=heartbeat_s, grace_s=grace_s)
    if scheme == "sqlite":
        return RDBStorage(url)
    raise ValueError(
        f"unsupported storage URL {url!r}: use a journal file path, journal:///path, "
        "redis://, postgresql://, mysql:// or (one worker only) sqlite:///"
    )
