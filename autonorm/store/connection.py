"""How a tuning database file is opened and written: WAL, locks retried, corruption handled.

A writable file is checked (``PRAGMA quick_check``) and, if corrupt, set aside with a warning
and replaced by a fresh one; it is then put in WAL mode, so that several tuning processes can
write it at once. A read-only file is opened with SQLite's ``mode=ro`` (and ``immutable=1`` for
the shipped database: no locks, no ``-wal`` or ``-shm`` files); a corrupt one is an error.
Every write is one ``BEGIN IMMEDIATE`` transaction, retried while another process holds the
lock (:mod:`autonorm.store.recovery`).
"""

from __future__ import annotations

import sqlite3
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from sqlite_utils import Database

from autonorm.errors import CorruptDatabaseWarning, DatabaseError
from autonorm.store import recovery

_T = TypeVar("_T")


def open_writable(path: Path) -> Database:
    """Open ``path`` for writing (a fresh file replaces a corrupt one, with a warning)."""
    conn = _connect(path, str(path))
    problem = _corruption_or_close(conn, str(path))
    if problem is not None:
        aside = recovery.set_aside(path)
        warnings.warn(
            f"tuning database {path} is corrupt ({problem}): moved it to {aside} and "
            "started a fresh one",
            CorruptDatabaseWarning,
            stacklevel=3,
        )
        conn = _connect(path, str(path))
    db = Database(conn, execute_plugins=False)
    try:
        recovery.with_retries(db.enable_wal, str(path))
        # In WAL mode NORMAL is still crash-safe; a power cut can only lose the last trials.
        db.execute("PRAGMA synchronous=NORMAL")
    except BaseException:
        conn.close()
        raise
    return db


def open_read_only(path: Path, immutable: bool) -> Database:
    """Open ``path`` read-only (``immutable``: the file cannot change while it is open).

    Raises:
        DatabaseError: the file does not exist or is corrupt.

    """
    if not path.is_file():
        raise DatabaseError(f"tuning database {path} does not exist")
    uri = path.resolve().as_uri() + "?mode=ro" + ("&immutable=1" if immutable else "")
    conn = _connect(path, uri, uri=True)
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
