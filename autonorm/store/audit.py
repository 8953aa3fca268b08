"""Whether a tuning database can be trusted: SQLite's integrity check and each winner's verdict.

``autonorm db check`` and ``autonorm db import`` both judge winners here. A winner is read from
its row without trusting it (a configuration or metrics column that is not JSON is a finding,
not a crash), its problem is rebuilt by its family, and :func:`autonorm.lookup.verdict` says
whether it still describes the kernel that would run on its GPU (the limits recorded for its
fingerprint; those of an H200 where none are, as export does).

Pure logic: re-verifying a kernel on a GPU is the caller's :data:`Verifier`.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autonorm import lookup
from autonorm.errors import DatabaseError
from autonorm.ops import registry
from autonorm.ops.base import Config, Problem
from autonorm.runtime.limits import H200, DeviceLimits
from autonorm.store import recovery
from autonorm.store.db import TuningDB
from autonorm.store.keys import TuningKey, Winner
from autonorm.store.schema import KEY_COLUMNS

# What a stored winner is, beyond lookup's verdicts: a row that cannot be read at all, and a
# kernel that failed to verify again on the GPU.
CORRUPT = "corrupt"

FAILED = "failed"

# Statuses that make a database untrustworthy (``autonorm db check`` exits non-zero).
BAD_STATUSES = frozenset({lookup.INVALID, CORRUPT, FAILED})


@dataclass(frozen=True)
class Reverified:
    """What verifying a winner's kernel again found.

    Attributes:
        ok: it matched the float64 reference on every case.
        detail: one line: what failed, or why it could not be verified.
        max_rel_err: the worst relative L2 error over the cases, if it ran.

    """

    ok: bool
    detail: str
    max_rel_err: float | None = None


# Verifies one usable winner's kernel again: (winner, its problem, its configuration).
Verifier = Callable[[Winner, Problem, Config], Reverified]


@dataclass(frozen=True)
class Judgement:
    """What a winner is to this autonorm.

    Attributes:
        status: ``usable``, ``stale``, ``invalid`` (lookup's verdicts), ``corrupt`` or
            ``failed`` (re-verification).
        detail: one line saying why.
        problem: its problem, when its key could be read.
        config: its configuration, when the family could read it.
        max_rel_err: the error against float64 a verification on this GPU found, if one ran.

    """

    status: str
    detail: str
    problem: Problem | None = None
    config: Config | None = None
    max_rel_err: float | None = None


@dataclass(frozen=True)
class Finding:
    """One row of the winners table and what it is (``autonorm db check``'s table row)."""

    row: dict[str, Any]
    winner: Winner | None
    judgement: Judgement


def integrity_problems(path: Path) -> list[str]:
    """Run SQLite's ``PRAGMA integrity_check`` on a database file, read-only.

    Returns:
        What the check found (empty when the file is sound); a file SQLite cannot read as a
        database gives one line saying so.

    Raises:
        DatabaseError: the file cannot be opened at all (missing, permissions).

    """
    uri = path.resolve().as_uri() + "?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=recovery.BUSY_TIMEOUT_S)
    except sqlite3.Error as exc:
        raise DatabaseError(f"cannot open tuning database {path}: {exc}") from exc
    try:
        rows = conn.execute("PRAGMA integrity_check").fetchall()
    except sqlite3.OperationalError as exc:
        if "malformed" in str(exc) or "not a database" in str(exc):
            return [str(exc)]
        raise DatabaseError(f"cannot read tuning database {path}: {exc}") from exc
    except sqlite3.DatabaseError as exc:
        return [str(exc)]
    finally:
        conn.close()
    found = [str(row[0]) for row in rows]
    return [] if found == ["ok"] else found


def decode_winner(row: dict[str, Any], source: str) -> Winner:
    """Read a winners row as a :class:`Winner`, checking each column's type.

    Raises:
        ValueError: a column is not what the schema promises (JSON that does not parse, a key
            that is not canonical, a configuration that is not an object, ...).

    """
    try:
        key = TuningKey(*(row[c] for c in KEY_COLUMNS))
        config = json.loads(row["config"])
        metrics = json.loads(row["metrics"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"unreadable row: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError("its configuration is not a JSON object")
    if not isinstance(metrics, dict):
        raise ValueError("its metrics are not a JSON object")
    kernel, legacy, tuned_at = row.get("kernel"), row.get("legacy_version"), row.get("tuned_at")
    for name, value in (("kernel digest", kernel), ("legacy version", legacy)):
        if value is not None and not isinstance(value, str):
            raise ValueError(f"its {name} is not a string")
    if not isinstance(tuned_at, str):
        raise ValueError("its tuned_at is not a time")
    return Winner(key=key, config=config, metrics=metrics, tuned_at=tuned_at, source=source,
                  kernel=kernel, legacy_version=legacy)


def limits_for(store: TuningDB, fingerprint: str) -> DeviceLimits:
    """The limits recorded for a GPU, or an H200's where none are (as export does)."""
    return store.device_limits(fingerprint) or H200


def judge(winner: Winner, limits: DeviceLimits) -> Judgement:
    """Say whether ``winner`` may run on a GPU of ``limits`` under this autonorm."""
    key = winner.key
    try:
        family = registry.get(key.op)
    except KeyError:
        return Judgement(CORRUPT, f"unknown op {key.op!r}")
    try:
        problem = family.problem(**key.fields)
    except (TypeError, ValueError) as exc:
        return Judgement(CORRUPT, f"problem unreadable: {exc}")
    try:
        status, config = lookup.verdict(winner, problem, limits)
    except (TypeError, ValueError) as exc:
        return Judgement(CORRUPT, f"configuration unreadable: {exc}", problem)
    if status == lookup.INVALID:
        reasons = "; ".join(family.check(config, problem, limits))
        return Judgement(status, f"the rules refuse it on {limits.name}: {reasons}", problem,
                         config)
    if status == lookup.STALE:
        what = ("it has no kernel digest and its version is not trusted"
                if winner.kernel is None else
                "its configuration renders another kernel than the one timed "
                "(another kernel version)")
        return Judgement(status, what, problem, config)
    return Judgement(status, "renders the kernel that was timed", problem, config)


def reverify(judgement: Judgement, winner: Winner, verifier: Verifier) -> Judgement:
    """Verify a usable winner's kernel again; a failure makes it ``failed``."""
    if judgement.status != lookup.USABLE:
        return judgement
    assert judgement.problem is not None and judgement.config is not None
    result = verifier(winner, judgement.problem, judgement.config)
    if result.ok:
        return Judgement(lookup.USABLE, result.detail, judgement.problem, judgement.config,
                         result.max_rel_err)
    return Judgement(FAILED, result.detail, judgement.problem, judgement.config)


def check_winners(store: TuningDB, verifier: Verifier | None = None) -> list[Finding]:
    """Judge every row of the winners table (and verify the usable ones again, if asked)."""
    findings = []
    rows = store.db["winners"].rows_where(order_by="dtype, hidden, rows_bucket, device, op")
    for row in rows:
        try:
            winner = decode_winner(row, store.source)
        except ValueError as exc:
            findings.append(Finding(row, None, Judgement(CORRUPT, str(exc))))
            continue
        judgement = judge(winner, limits_for(store, winner.key.device))
        if verifier is not None:
            judgement = reverify(judgement, winner, verifier)
        findings.append(Finding(row, winner, judgement))
    return findings
