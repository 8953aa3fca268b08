"""Tuning on first use: a shape nobody tuned is tuned at its first call, once for all processes.

Off by default. Turned on (``AUTONORM_TUNE_ON_FIRST_USE=1``, or :func:`tune_on_first_use`), the
first call of a shape whose rows bucket has no stored winner on this GPU (a lookup that ends in
a nearest bucket, a neighbour or the default) runs a short search through
:func:`autonorm.tune.session.tune_and_store`, within a budget of seconds, stores the winner in
the user's database, and dispatch runs it from then on. Other processes find it there.

Processes agree through a lock file per (user database, device, problem, rows bucket) in the
cache directory: the first to take it tunes; the others wait, bounded, and then look up again,
finding the winner instead of tuning. One that waits too long keeps the choice it had.

Nothing here may break the call that asked: no tuning while a CUDA graph is being captured
(the search would run on the GPU behind the capture's back), none into a user database that
cannot be written (said once), and a search that fails leaves the choice as it was, with one
line on stderr. Progress is one line on stderr when a search starts and one when it ends.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autonorm import settings
from autonorm.ops.base import problem_key, rows_bucket

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory locks, each process tunes
    fcntl = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from autonorm.lookup import Choice
    from autonorm.ops.base import Problem
    from autonorm.runtime.device import DeviceInfo
    from autonorm.tune.search import TuneSettings
    from autonorm.tune.session import TunedKernel

__all__ = ["KNOWN_SOURCES", "capturing", "search_settings", "settle", "tune_on_first_use"]

LookUp = Callable[["Problem", int, int], "Choice"]

# Lookup sources that are a winner tuned for the exact rows bucket on this GPU: nothing to tune.
KNOWN_SOURCES = frozenset({"user", "shipped"})

# The share of the budget the search itself may take; the evaluator's start (CUDA, inputs,
# copy bandwidth) and the finals take the rest.
SEARCH_SHARE = 0.6

# An H200 measures about a candidate a second (40 in 36 s, docs/tuning.md): that many trials
# fit the budget; the search's timeout stops it first where candidates take longer.
TRIALS_PER_S = 1.0

MIN_TRIALS = 4

# The finals of a short search: the best 3 against each other, 3 rounds.
FINALS_TOP = 3

FINALS_ROUNDS = 3

# How long a process waits for another one tuning the same shape: past the budget, the other
# may still be starting its evaluator or running its finals.
WAIT_FACTOR = 2.0

WAIT_EXTRA_S = 30.0

POLL_S = 0.05

# The setting from Python, ahead of the environment: None, or (enabled, budget or None).
_OVERRIDE: tuple[bool, float | None] | None = None

# Keys tuned (or tried) in this process: a key is tuned at most once a process.
_ATTEMPTED: set[tuple[Any, ...]] = set()

# Messages said once a process (a read-only database, a bad budget variable).
_SAID: set[str] = set()


def tune_on_first_use(enabled: bool = True, *, budget_s: float | None = None) -> None:
    """Tune shapes nobody tuned at their first call in this process (or stop doing so).

    The first call of a shape whose rows bucket has no winner on this GPU, in the user's
    database or the shipped one, runs a short search within ``budget_s`` seconds, stores the
    winner in the user's database and runs it from then on; other processes find it there.
    It overrides ``AUTONORM_TUNE_ON_FIRST_USE`` in this process (child processes read the
    variable). Progress goes to stderr.

    Args:
        enabled: tune on first use (True) or never (False).
        budget_s: seconds one shape's tuning may take, from 1 to 300; None keeps
            ``AUTONORM_FIRST_USE_BUDGET_S`` (default 15).

    Raises:
        TypeError: ``enabled`` is not a bool.
        ValueError: ``budget_s`` is not a number of seconds from 1 to 300.

    """
    global _OVERRIDE
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be True or False, got {enabled!r}")
    if budget_s is not None:
        low, high = settings.FIRST_USE_BUDGET_BOUNDS_S
        number = isinstance(budget_s, (int, float)) and not isinstance(budget_s, bool)
        if not number or not math.isfinite(budget_s) or not low <= budget_s <= high:
            raise ValueError(
                f"budget_s must be a number of seconds from {low:g} to {high:g}, got {budget_s!r}"
            )
        budget_s = float(budget_s)
    _OVERRIDE = (enabled, budget_s)


def _enabled() -> bool:
    return _OVERRIDE[0] if _OVERRIDE is not None else settings.tune_on_first_use()


def _budget_s() -> float:
    if _OVERRIDE is not None and _OVERRIDE[1] is not None:
        return _OVERRIDE[1]
    try:
        return settings.first_use_budget_s()
    except ValueError as exc:
        _say_once(f"{exc}; using {settings.FIRST_USE_BUDGET_S:g} s")
        return settings.FIRST_USE_BUDGET_S


def search_settings(budget_s: float) -> TuneSettings:
    """Return the search settings that fit a budget of ``budget_s`` seconds."""
    from autonorm.tune.search import TuneSettings

    return TuneSettings(
        n_trials=max(MIN_TRIALS, round(budget_s * TRIALS_PER_S)),
        timeout_s=SEARCH_SHARE * budget_s,
        finals_top=FINALS_TOP,
        finals_rounds=FINALS_ROUNDS,
    )


def wait_limit_s(budget_s: float) -> float:
    """Return how long to wait for another process tuning the same shape."""
    return WAIT_FACTOR * budget_s + WAIT_EXTRA_S


def capturing() -> bool:
    """Whether this thread's current CuPy or torch stream is capturing a CUDA graph.

    Only a library already imported can be capturing. A state that cannot be asked counts as
    capturing: the call then keeps its choice, which is always safe.
    """
    torch = sys.modules.get("torch")
    cupy = sys.modules.get("cupy")
    try:
        if torch is not None and torch.cuda.is_initialized():
            if torch.cuda.is_current_stream_capturing():
                return True
        if cupy is not None:
            stream = cupy.cuda.get_current_stream()
            # The legacy default stream never captures, and asking it while another stream
            # captures is an error: only a stream of its own is asked.
            return bool(stream.ptr) and bool(stream.is_capturing())
    except Exception:  # noqa: BLE001 - unknown: keep the choice
        return True
    return False


def settle(
    problem: Problem, rows: int, device_id: int, choice: Choice, look_up: LookUp
) -> Choice:
    """Return the choice to run: ``choice``, or the winner of a tuning on first use.

    Tunes only when the setting is on and ``choice`` is no exact-bucket winner; never raises
    for a failed tuning (it says so on stderr and returns ``choice``).

    Args:
        problem: what the call runs.
        rows: its row count.
        device_id: its GPU.
        choice: what the lookup picked.
        look_up: the lookup to ask again once a winner may be stored (dispatch's).

    """
    if choice.source in KNOWN_SOURCES or not _enabled():
        return choice
    if capturing():
        # Not marked as tried: a later call outside the capture may still tune.
        return choice
    key = (device_id, problem, rows_bucket(rows), str(settings.user_db_path()))
    if key in _ATTEMPTED:
        return choice
    _ATTEMPTED.add(key)
    what = f"{type(problem).op} {problem.describe()} at rows bucket {rows_bucket(rows)}"
    try:
        return _tune_or_wait(problem, rows, device_id, choice, look_up, what)
    except Exception as exc:  # noqa: BLE001 - a failed tuning must not fail the call
        error = " ".join(f"{type(exc).__name__}: {exc}".split())
        _say(f"tuning {what} failed ({error}); using {_described(choice)}")
        return choice


def _tune_or_wait(
    problem: Problem, rows: int, device_id: int, choice: Choice, look_up: LookUp, what: str
) -> Choice:
    """Tune under the shape's lock, or wait for the process holding it and look up again."""
    from autonorm.runtime import device as devices

    db_path = settings.user_db_path()
    reason = _read_only_reason(db_path)
    if reason is not None:
        _say_once(
            f"tuning database {db_path} is read-only ({reason}): shapes are not tuned on "
            "first use; using the configurations found"
        )
        return choice
    budget = _budget_s()
    info = devices.query_device(device_id)
    wait_s = wait_limit_s(budget)

    waited: list[bool] = []

    def on_wait() -> None:
        waited.append(True)
        _say(f"another process is tuning {what}; waiting up to {wait_s:.0f} s for its winner")

    with _held(_lock_path(db_path, info, problem, rows), wait_s, on_wait) as got:
        if not got:
            _say(f"{what} is still being tuned elsewhere; using {_described(choice)}")
            return choice
        again = look_up(problem, rows, device_id)
        if again.source in KNOWN_SOURCES:
            # Another process stored it while this one looked or waited.
            if waited:
                _say(f"using the winner stored for {what}: {again.config.label()}")
            return again
        _say(
            f"no tuned kernel for {what} on {info.name} (it would run {_described(choice)}); "
            f"tuning it within about {budget:g} s"
        )
        before: list[float] = []
        tuned = _search(problem, rows, device_id, info, budget, choice, before)
    if not tuned.stored:
        _say(f"tuning {what} found no candidate that passed verification; using "
             f"{_described(choice)}")
        return choice
    now = look_up(problem, rows, device_id)
    timing = tuned.timing
    assert timing is not None and tuned.config is not None
    was = f"; {_described(choice)} ran {before[0]:.1f} us" if before else ""
    share = f", {100 * timing.share:.0f}% of copy" if timing.share > 0 else ""
    _say(
        f"tuned {what} in {tuned.elapsed_s:.1f} s ({tuned.evaluated} candidates): "
        f"{tuned.config.label()} at {timing.median_us:.1f} us{share}{was}; stored in "
        f"{tuned.db_path}, source {now.source}"
    )
    return now


def _search(
    problem: Problem,
    rows: int,
    device_id: int,
    info: DeviceInfo,
    budget_s: float,
    current: Choice,
    before: list[float],
) -> TunedKernel:
    """Run the short search and store its winner; append the current choice's time to ``before``.

    The current choice is measured first and defends in the finals
    (:func:`autonorm.tune.session.tune_and_store`): the winner stored is it, or one that
    the finals timed clearly faster.
    """
    import optuna

    from autonorm.ops.registry import family_of
    from autonorm.tune import session

    family = family_of(problem)
    seeds = list(dict.fromkeys([current.config, *family.seeds(problem, info.limits(), rows)]))

    def on_trial(config: Any, outcome: Any, number: int) -> None:  # noqa: ARG001
        if config == current.config and outcome.ok and not before:
            before.append(outcome.timing.median_us)

    level = optuna.logging.get_verbosity()
    # Optuna's INFO lines ("A new study created ...") and warnings would bury the two lines
    # this module promises on stderr.
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return session.tune_and_store(
                problem, rows, settings=search_settings(budget_s), device_id=device_id,
                device=info, quiet=True, seeds=seeds, on_trial=on_trial,
            )
    finally:
        optuna.logging.set_verbosity(level)


def _read_only_reason(path: Path) -> str | None:
    """Say why the user's database cannot take a winner, or return None if it can."""
    from autonorm.store import connection

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"its directory cannot be created: {exc.strerror}"
    return connection.read_only_reason(path)


def _lock_path(db_path: Path, info: DeviceInfo, problem: Problem, rows: int) -> Path:
    """The lock file of one (user database, device, problem, rows bucket)."""
    key = [str(db_path.resolve()), info.fingerprint, type(problem).op, problem_key(problem),
           rows_bucket(rows)]
    digest = hashlib.sha256(json.dumps(key).encode()).hexdigest()[:24]
    return settings.first_use_lock_dir() / f"{digest}.lock"


@contextlib.contextmanager
def _held(path: Path, wait_s: float, on_wait: Callable[[], None]) -> Iterator[bool]:
    """Hold the lock file ``path`` exclusively; yield False if it stayed taken for ``wait_s``.

    ``on_wait`` is called once, when the lock is found taken.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        got = fcntl is None or _take(fd, wait_s, on_wait)
        yield got
    finally:
        os.close(fd)  # releases the lock


def _take(fd: int, wait_s: float, on_wait: Callable[[], None]) -> bool:
    deadline = time.monotonic() + wait_s
    waiting = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        if not waiting:
            on_wait()
            waiting = True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)


def _described(choice: Choice) -> str:
    """Say in words where a lookup's choice came from."""
    places = {
        "default": "the default configuration",
        "user-nearest": "your winner of the nearest rows bucket",
        "shipped-nearest": "the shipped winner of the nearest rows bucket",
        "user-neighbour": "your winner of a neighbouring hidden size",
        "shipped-neighbour": "the shipped winner of a neighbouring hidden size",
    }
    return places.get(choice.source, f"the {choice.source} configuration")


def _say(message: str) -> None:
    """One line on stderr (not a warning: it is progress, and filters must not hide it)."""
    print(f"autonorm: {message}", file=sys.stderr, flush=True)


def _say_once(message: str) -> None:
    if message not in _SAID:
        _SAID.add(message)
        _say(message)
