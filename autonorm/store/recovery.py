"""What the tuning database does when SQLite says no: locks retried, corrupt files set aside.

Several tuning processes may write one file at once. SQLite waits inside its own busy handler
for ``BUSY_TIMEOUT_S``, but reports SQLITE_BUSY without calling it in a few cases (WAL
recovery, a journal-mode change, a deferred transaction that cannot upgrade), so whole actions
are also retried here, with exponential backoff and jitter so that contending processes spread
out. A file that fails ``PRAGMA quick_check`` is renamed aside, with its sidecar files, so that
a fresh database can take its place.

Processes that open one file at once agree through the lock file ``<db>.lock`` beside it
(:func:`locked`): each holds it shared while it opens and checks the file, and the one that
sets a corrupt file aside holds it exclusive. So no file is renamed while another process is
still reading it (its connection could otherwise delete the new file's ``-wal`` as it closes),
and a process that waited finds the fresh file in place and uses it instead of setting aside
a healthy database that others have already written to.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import sqlite3
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import TypeVar

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory locks, recovery is unguarded
    fcntl = None  # type: ignore[assignment]

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

# The lock file beside a database (:func:`locked`).
LOCK_SUFFIX = ".lock"

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


@contextlib.contextmanager
def locked(path: Path, *, exclusive: bool) -> Iterator[None]:
    """Hold the lock file of the database ``path``: shared to open it, exclusive to replace it.

    Raises:
        DatabaseError: the lock file cannot be created (a read-only directory).

    """
    lock_path = path.with_name(path.name + LOCK_SUFFIX)
    try:
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
        except PermissionError:
            fd = os.open(lock_path, os.O_RDONLY)  # another user's lock file locks as well
    except OSError as exc:
        raise DatabaseError(
            f"cannot create the lock file {lock_path} of tuning database {path}: {exc.strerror}"
        ) from exc
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # releases the lock


def set_aside(path: Path) -> Path:
    """Rename a corrupt database (and its sidecars) to ``<name>.corrupt-<UTC time>[-<n>]``.

    The name is one that no file has yet, and no earlier file is ever replaced, so every corrupt
    file stays as evidence. The caller holds :func:`locked` exclusive.
    """
    stamp = utc_stamp()
    for n in itertools.count(1):
        aside = path.with_name(f"{path.name}.corrupt-{stamp}" + (f"-{n}" if n > 1 else ""))
        names = [aside.with_name(aside.name + suffix) for suffix in ("", *SIDECAR_SUFFIXES)]
        if not any(os.path.lexists(name) for name in names) and _move_new(path, aside):
            break
    for suffix in SIDECAR_SUFFIXES:
        sidecar, dest = path.with_name(path.name + suffix), aside.with_name(aside.name + suffix)
        if os.path.lexists(sidecar) and not _move_new(sidecar, dest):
            raise DatabaseError(f"cannot set {sidecar} aside: {aside.name}{suffix} exists")
    return aside


def utc_stamp() -> str:
    """The UTC time in the names of files set aside, e.g. ``20261201T235023Z``."""
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def _move_new(source: Path, dest: Path) -> bool:
    """Rename ``source`` to ``dest`` unless ``dest`` exists (then return False, moving nothing).

    A hard link never replaces a file, where ``os.rename`` silently would. A file system without
    hard links falls back to a check and a rename, which the exclusive lock keeps from racing
    with other autonorm processes.
    """
    try:
        os.link(source, dest)
    except FileExistsError:
        return False
    except OSError:
        if os.path.lexists(dest):
            return False
        os.rename(source, dest)
        return True
    os.unlink(source)
    return True


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
