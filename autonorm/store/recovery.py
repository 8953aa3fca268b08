"""What the tuning database does when SQLite says no: locks retried, corrupt files set aside.

Several tuning processes may write one file at once. SQLite waits inside its own busy handler
for ``BUSY_TIMEOUT_S``, but reports SQLITE_BUSY without calling it in a few cases (WAL
recovery, a journal-mode change, a deferred transaction that cannot upgrade), so whole actions
are also retried here, with exponential backoff and jitter so that contending processes spread
out. A file that fails ``PRAGMA quick_check`` is renamed aside, with its sidecar files, so that
a fresh database can take its place.
"""

from __future__ import annotations

import os
import random
import sqlite3
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import TypeVar

from autonorm.errors import DatabaseError

# SQLite waits this long inside its own busy handler before reporting "database is locked".
BUSY_TIMEOUT_S = 5.0

# Attempts of one action while the file stays locked, and the backoff between them.
MAX_ATTEMPTS = 8

BACKOFF_START_S = 0.02

BACKOFF_MAX_S = 1.0

# Primary result codes (the low byte of an extended code) that matter here.
_SQLITE_BUSY = 5

_SQLITE_LOCKED = 6

_SQLITE_CORRUPT = 11

_SQLITE_NOTADB = 26

# Files SQLite keeps next to a database. They belong to a corrupt database: they move aside with
# it (evidence for a bug report), so that none is ever paired with the fresh file.
SIDECAR_SUFFIXES = ("-wal", "-shm", "-journal")

_T = TypeVar("_T")


def find_corruption(conn: sqlite3.Connection) -> str | None:
    """Return why the database is corrupt, or None if ``PRAGMA quick_check`` passes.

    Raises:
        sqlite3.Error: any failure other than corruption (a lock, an I/O error).

    """
    try:
        rows = conn.execute("PRAGMA quick_check").fetchall()
    except sqlite3.DatabaseError as exc:
        if is_corruption(exc):
            return str(exc)
        raise
    if rows == [("ok",)]:
        return None
    return "; ".join(str(r[0]) for r in rows[:3])


def set_aside(path: Path) -> Path:
    """Rename a corrupt database (and its sidecar files) to ``<name>.corrupt-<UTC time>``."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while aside.exists():
        n += 1
        aside = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    try:
        os.replace(path, aside)
    except FileNotFoundError:
        pass  # another process set it aside first
    for suffix in SIDECAR_SUFFIXES:
        sidecar = path.with_name(path.name + suffix)
        try:
            os.replace(sidecar, aside.with_name(aside.name + suffix))
        except FileNotFoundError:
            pass
    return aside


def is_corruption(exc: sqlite3.Error) -> bool:
    """Whether ``exc`` says the file is not a sound SQLite database."""
    code = _primary_code(exc)
    if code is not None:
        return code in (_SQLITE_CORRUPT, _SQLITE_NOTADB)
    message = str(exc)
    return "malformed" in message or "not a database" in message


def is_locked(exc: sqlite3.Error) -> bool:
    """Whether ``exc`` says another connection holds a lock (worth retrying)."""
    code = _primary_code(exc)
    if code is not None:
        return code in (_SQLITE_BUSY, _SQLITE_LOCKED)
    return "locked" in str(exc) or "busy" in str(exc)


def with_retries(action: Callable[[], _T], where: str) -> _T:
    """Run ``action``, retrying with backoff while SQLite says the database is locked.

    Raises:
        DatabaseError: the database stayed locked through ``MAX_ATTEMPTS`` attempts.
        sqlite3.OperationalError: any other failure, at once.

    """
    delay = BACKOFF_START_S
    for attempt in range(MAX_ATTEMPTS):
        try:
            return action()
        except sqlite3.OperationalError as exc:
            if not is_locked(exc):
                raise
            if attempt == MAX_ATTEMPTS - 1:
                raise DatabaseError(
                    f"tuning database {where} stayed locked through {MAX_ATTEMPTS} attempts: "
                    f"{exc}"
                ) from exc
        time.sleep(delay * (1.0 + random.random()))
        delay = min(delay * 2.0, BACKOFF_MAX_S)
    raise AssertionError("unreachable")  # pragma: no cover


def _primary_code(exc: sqlite3.Error) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+
    return None if code is None else code & 0xFF
