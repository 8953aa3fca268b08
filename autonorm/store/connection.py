"""How a tuning database file is opened and written: WAL, locks retried, corruption handled.

A writable file is checked (``PRAGMA quick_check``) and, if corrupt, set aside with a warning
and replaced by a fresh one, under the lock file of :func:`autonorm.store.recovery.locked` so
that processes opening one corrupt file at once set it aside once and all use the fresh file.
It is then put in WAL mode, so that several tuning processes can write it at once. A file that
cannot be written (a read-only file, directory or file system: :func:`read_only_reason`) is not
opened for writing at all. A read-only file is opened with SQLite's ``mode=ro`` (and
``immutable=1`` for the shipped database: no locks, no ``-wal`` or ``-shm`` files); a corrupt
one is an error. Every write is one ``BEGIN IMMEDIATE`` transaction, retried while another
process holds the lock (:mod:`autonorm.store.recovery`).
"""

from __future__ import annotations

import os
import sqlite3
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from sqlite_utils import Database

from autonorm.errors import CorruptDatabaseWarning, DatabaseError, ReadOnlyDatabaseWarning
from autonorm.store import recovery

_T = TypeVar("_T")


# SQLite's result code for a file it cannot open (a WAL file's -shm in a read-only directory).
_SQLITE_CANTOPEN = 14

# Read-only databases already reported in this process (a warning once per file).
_REPORTED: set[Path] = set()


def open_writable(path: Path) -> Database:
    """Open ``path`` for writing (a fresh file replaces a corrupt one, with a warning).

    Raises:
        DatabaseError: the file cannot be written (:func:`read_only_reason`), or opened.

    """
    if path.is_dir():
        raise DatabaseError(f"tuning database {path} is a directory")
    if not path.parent.is_dir():
        raise DatabaseError(
            f"cannot create tuning database {path}: its directory {path.parent} does not exist"
        )
    reason = read_only_reason(path)
    if reason is not None:
        raise _read_only_error(path, reason)
    with recovery.locked(path, exclusive=False):
        conn = _connect(path, str(path))
        problem = _corruption_or_close(conn, str(path))
    if problem is not None:
        conn = _replace_corrupt(path)
    db = Database(conn, execute_plugins=False)
    try:
        recovery.with_retries(db.enable_wal, str(path))
        # In WAL mode NORMAL is still crash-safe; a power cut can only lose the last trials.
        db.execute("PRAGMA synchronous=NORMAL")
    except BaseException:
        conn.close()
        raise
    return db


def read_only_reason(path: Path) -> str | None:
    """Say why the database ``path`` cannot be written, or return None if it can.

    Both the file and its directory must be writable: SQLite keeps its ``-wal`` and ``-shm``
    files (and the lock file) beside the database. ``os.access`` answers for this process, a
    read-only file system included.
    """
    folder = path.parent
    # Looked at twice: a corrupt file that another process sets aside in between is missing
    # for a moment, then there again, fresh.
    for _ in range(2):
        if os.access(path, os.W_OK) or not os.path.lexists(path):
            break
    else:
        return "the file cannot be written"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"its directory {folder} cannot be written"
    return None


def _read_only_error(path: Path, reason: str) -> DatabaseError:
    return DatabaseError(
        f"tuning database {path} is read-only ({reason}): tuning results cannot be stored "
        "there; use a writable file (AUTONORM_DB for the user's database)"
    )


def report_read_only(path: Path, reason: str) -> None:
    """Warn, once per file and process, that a database is read but cannot store results."""
    if path in _REPORTED:
        return
    _REPORTED.add(path)
    warnings.warn(
        f"tuning database {path} is read-only ({reason}): its winners are used, but tuning "
        "results cannot be stored there",
        ReadOnlyDatabaseWarning,
        stacklevel=3,
    )


def _replace_corrupt(path: Path) -> sqlite3.Connection:
    """Set the corrupt ``path`` aside and open a fresh file, unless another process already did."""
    with recovery.locked(path, exclusive=True):
        # Check again under the exclusive lock: the file found corrupt may be gone, replaced
        # by a fresh one that other processes are writing; only the corrupt one moves aside.
        conn = _connect(path, str(path))
        now = _corruption_or_close(conn, str(path))
        if now is None:
            return conn
        aside = recovery.set_aside(path)
        conn = _connect(path, str(path))
        try:
            # Create the fresh file before the lock is released, so that no process waiting
            # for it ever finds no file at all.
            recovery.with_retries(lambda: conn.execute("PRAGMA journal_mode=WAL"), str(path))
        except BaseException:
            conn.close()
            raise
    warnings.warn(
        f"tuning database {path} is corrupt ({now}): moved it to {aside} and started a "
        "fresh one",
        CorruptDatabaseWarning,
        stacklevel=4,
    )
    return conn


def open_read_only(path: Path, immutable: bool) -> Database:
    """Open ``path`` read-only (``immutable``: the file cannot change while it is open).

    A WAL file whose ``-shm`` cannot be opened or created (in a read-only directory, once its
    last writer closed it and removed its ``-wal``) is read as immutable: what was checkpointed.

    Raises:
        DatabaseError: the file does not exist or is corrupt.

    """
    if not path.is_file():
        raise DatabaseError(f"tuning database {path} does not exist")
    uri = path.resolve().as_uri() + "?mode=ro"
    conn = _connect(path, uri + ("&immutable=1" if immutable else ""), uri=True)
    try:
        problem = _corruption_or_close(conn, str(path))
    except sqlite3.OperationalError as exc:
        if immutable or (getattr(exc, "sqlite_errorcode", 0) & 0xFF) != _SQLITE_CANTOPEN:
            raise
        conn = _connect(path, uri + "&immutable=1", uri=True)
        problem = _corruption_or_close(conn, str(path))
    if problem is not None:
        raise DatabaseError(f"tuning database {path} is corrupt: {problem}")
    return Database(conn, execute_plugins=False)


def transact(db: Database, body: Callable[[Database], _T], where: str) -> _T:
    """Run ``body`` in one write transaction, retrying it while the file is locked.

    Raises:
        DatabaseError: the file stayed locked, or SQLite refused the write.

    """

    def attempt() -> _T:
        # IMMEDIATE takes the write lock up front, so SQLite's busy handler applies; a
        # deferred transaction could fail mid-way when another writer commits first.
        db.conn.execute("BEGIN IMMEDIATE")
        try:
            result = body(db)
            db.conn.execute("COMMIT")
        except BaseException:
            db.rollback()
            raise
        return result

    try:
        return recovery.with_retries(attempt, where)
    except sqlite3.Error as exc:
        raise DatabaseError(f"cannot write tuning database {where}: {exc}") from exc


def _connect(path: Path, target: str, *, uri: bool = False) -> sqlite3.Connection:
    try:
        return sqlite3.connect(target, timeout=recovery.BUSY_TIMEOUT_S, uri=uri)
    except sqlite3.Error as exc:
        raise DatabaseError(f"cannot open tuning database {path}: {exc}") from exc


def _corruption_or_close(conn: sqlite3.Connection, where: str) -> str | None:
    """Return what is corrupt about an open file (None if sound); close it unless sound."""
    try:
        problem = recovery.with_retries(lambda: recovery.find_corruption(conn), where)
    except BaseException:
        conn.close()
        raise
    if problem is not None:
        conn.close()
    return problem
