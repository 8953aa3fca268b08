"""The bookkeeping of a shared study: who owns a trial, which are stale, which are duplicates.

Every trial the search touches carries user attributes that explain it:

* ``owner``: ``{"host", "pid", "start"}`` of the process that asked it, written before its
  parameters, so a RUNNING trial whose owner died on this host is known to be stale.
* ``role``: ``evaluate`` (handed to the evaluator), ``invalid`` (rejected by the family's
  ``check``), ``duplicate`` (an earlier trial has, or is measuring, the same configuration;
  see ``duplicate_of``) or ``skipped`` (asked, then not measured because the budget or the
  time ran out).
* ``failure`` and ``error``: the failure class (:data:`autonorm.results.FAILURE_CLASSES`, or
  ``interrupted``) and its message.
* ``timing``: the search :class:`~autonorm.results.Timing` of a measured candidate.

A configuration is measured at most once per study, across processes and across runs: the
functions here read the study's trials and decide, for each newly asked one, whether it is
invalid, already measured, being measured elsewhere, or to be measured.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, Trial, TrialState

from autonorm.ops.base import Config, Family, Problem
from autonorm.results import FAILURE_CLASSES, Timing
from autonorm.runtime.limits import DeviceLimits

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

# Asking a trial and writing its parameters and owner takes milliseconds; a RUNNING trial
# without an owner for this long was left behind by a process that died in between.
UNOWNED_GRACE = timedelta(minutes=5)

# How long to wait for a lower-numbered trial of another process to get its parameters before
# deciding without it (bounds the wait if that process died on another host).
READY_WAIT_S = 10.0

READY_POLL_S = 0.02

# Compiler logs can be long; the study keeps the start, which names the error.
MAX_ERROR_CHARS = 4000


def params_key(params: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Return a hashable identity of a configuration's parameters."""
    return tuple(sorted(params.items()))


# --------------------------------------------------------------------------- owners


def _proc_stat(pid: int) -> tuple[str, str] | None:
    """Return (state, start time in clock ticks) of a Linux process, or None if unknown."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
        fields = text.rpartition(")")[2].split()
        return fields[0], fields[19]
    except (OSError, IndexError):
        return None


def owner_of_this_process() -> dict[str, Any]:
    """Describe this process, so others can tell whether its RUNNING trials are alive."""
    pid = os.getpid()
    stat = _proc_stat(pid)
    return {"host": socket.gethostname(), "pid": pid, "start": stat[1] if stat else None}


def owner_alive(owner: dict[str, Any]) -> bool:
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


def stale_reason(trial: FrozenTrial) -> str | None:
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
    if owner_alive(owner):
        return None
    return f"process {owner.get('pid')} on {owner.get('host')} died while evaluating"


def fail_stale_trials(storage: BaseStorage, study_id: int, trials: Sequence[FrozenTrial]) -> None:
    """Mark RUNNING trials of dead processes FAIL/interrupted, so their configs are retried."""
    for trial in trials:
        if trial.state != TrialState.RUNNING:
            continue
        reason = stale_reason(trial)
        if reason is None:
            continue
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
        try:
            storage.set_trial_user_attr(trial_id, ATTR_FAILURE, INTERRUPTED)
            storage.set_trial_user_attr(trial_id, ATTR_ERROR, f"stale: {reason}")
            storage.set_trial_state_values(trial_id, TrialState.FAIL)
        except UpdateFinishedTrialError:
            pass  # another process marked it first


# --------------------------------------------------------------------------- the study's state


def is_measured(trial: FrozenTrial) -> bool:
    """Return True if the evaluator measured the trial's candidate (success or final failure)."""
    if trial.user_attrs.get(ATTR_ROLE) != ROLE_EVALUATE:
        return False
    if trial.state == TrialState.COMPLETE:
        return True
    return trial.state == TrialState.FAIL and trial.user_attrs.get(ATTR_FAILURE) in FINAL_FAILURES


@dataclass
class Summary:
    """What the study holds, recomputed from its trials."""

    evaluated: int = 0
    in_flight_elsewhere: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    best: FrozenTrial | None = None


def summarize(trials: Sequence[FrozenTrial], me: dict[str, Any]) -> Summary:
    """Count measured candidates, failures by class, trials measured elsewhere, and the best."""
    measured: set[tuple] = set()
    failed: dict[str, set[tuple]] = {name: set() for name in FAILURE_CLASSES}
    summary = Summary()
    for trial in trials:
        key = params_key(trial.params)
        if is_measured(trial):
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
                and owner_alive(owner)
            ):
                summary.in_flight_elsewhere += 1
    summary.evaluated = len(measured)
    summary.failures = {name: len(keys) for name, keys in failed.items()}
    return summary


def timing_of(trial: FrozenTrial | None) -> Timing | None:
    """Return the search timing stored on a completed trial."""
    if trial is None or ATTR_TIMING not in trial.user_attrs:
        return None
    return Timing(**trial.user_attrs[ATTR_TIMING])


# --------------------------------------------------------------------------- readiness


class _Missing(Exception):
    """A replayed suggestion asked for a parameter the trial does not have yet."""


class _Replay:
    """Answers a family's ``suggest`` from a trial's stored parameters, as far as they go."""

    def __init__(self, params: dict[str, Any]) -> None:
        self._params = params

    def _answer(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if name not in self._params:
            raise _Missing(name)
        return self._params[name]

    def __getattr__(self, attr: str) -> Any:
        # Every suggest_* of an Optuna trial takes the parameter's name first.
        if attr.startswith("suggest_"):
            return self._answer
        raise AttributeError(attr)


def has_all_params(trial: FrozenTrial, family: Family) -> bool:
    """Return True once the trial's process has written every parameter its family asks.

    The family's ``suggest`` is replayed on the parameters written so far: it may ask some
    parameters only for some values of others (conditional spaces), so only the family knows
    when a trial is complete.
    """
    try:
        family.suggest(_Replay(trial.params))
    except _Missing:
        return False
    except Exception:  # noqa: BLE001 - the parameters are all written; what they mean is not ours
        return True
    return True


def snapshot_when_ready(
    study: optuna.Study, mine: set[int], given_up: set[int], family: Family
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
            and not has_all_params(t, family)
            and stale_reason(t) is None
        ]
        if not pending:
            return trials
        if time.monotonic() > deadline:
            given_up.update(pending)
            return trials
        time.sleep(READY_POLL_S)


# --------------------------------------------------------------------------- deciding


@dataclass
class Ask:
    """One asked trial and what to do with it."""

    trial: Trial
    config: Config
    action: str = ROLE_EVALUATE  # evaluate | invalid | copy | failed | elsewhere | defer
    reasons: list[str] = field(default_factory=list)
    prior: FrozenTrial | None = None
    original: int | None = None  # in-batch trial number a deferred duplicate waits for


def plan(
    asks: list[Ask],
    trials: Sequence[FrozenTrial],
    family: Family,
    problem: Problem,
    limits: DeviceLimits,
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
        ask.reasons = family.check(ask.config, problem, limits)
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
                and owner_alive(other.user_attrs[ATTR_OWNER])
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
