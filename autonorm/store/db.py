"""The tuning database: devices seen, every trial run, and the winning kernel per problem.

Two databases exist: the user's writable one (``settings.user_db_path()``) and a read-only one
shipped with autonorm (``settings.shipped_db_path()``). Both have the same schema
(:mod:`autonorm.store.schema`), created and queried through sqlite-utils.

Writable file databases use WAL journaling, a busy timeout and retries with backoff, so several
tuning processes can write one file at once without losing a row. A file that is not a valid
SQLite database is moved aside and replaced by a fresh one, with a warning, once however many
processes open it at the same time (:mod:`autonorm.store.connection`). A user database that
cannot be written is read read-only (:meth:`TuningDB.open_user_to_read`). The shipped database
is opened with SQLite's ``mode=ro`` and ``immutable=1``: it cannot be written even by accident,
and no ``-wal`` or ``-shm`` file appears next to it.

The database stores and returns winners; whether one still describes the kernel that would run
is :mod:`autonorm.lookup`'s question.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from sqlite_utils import Database

from autonorm import settings
from autonorm.errors import DatabaseError
from autonorm.ops.base import Config
from autonorm.results import FAILURE_CLASSES, Outcome
from autonorm.runtime.device import DeviceInfo
from autonorm.runtime.limits import DeviceLimits
from autonorm.store import connection, records, schema
from autonorm.store.keys import TuningKey, Winner, load_object
from autonorm.store.schema import KEY_COLUMNS, SCHEMA_VERSION, TRIAL_METRIC_COLUMNS

__all__ = ["KEY_COLUMNS", "SCHEMA_VERSION", "STATUSES", "TuningDB", "TuningKey", "Winner"]

STATUSES: tuple[str, ...] = ("ok", *FAILURE_CLASSES)

_T = TypeVar("_T")


class TuningDB:
    """The tuning database (a file, or in memory).

    Use as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        read_only: bool = False,
        immutable: bool = False,
        source: str = "user",
    ) -> None:
        """Open (and create, migrate or repair) a tuning database.

        Args:
            path: the database file; None or ":memory:" gives an in-memory database.
            read_only: open with SQLite's ``mode=ro``: every write method raises
                :class:`DatabaseError`, and the file is never migrated or repaired.
            immutable: with ``read_only``, also tell SQLite the file cannot change (no locks,
                no ``-wal``/``-shm`` files; right for the shipped database, wrong for a file
                another process is writing).
            source: the :attr:`Winner.source` of winners read from this database.

        Raises:
            DatabaseError: the file cannot be opened, is of a newer schema, is not an autonorm
                database, or (read-only) is corrupt or of an older schema.

        """
        self.read_only = read_only
        self.source = source
        self.path: Path | None = None
        if path is None or str(path) == ":memory:":
            if read_only:
                raise ValueError("an in-memory tuning database cannot be read-only")
        else:
            self.path = Path(path)
        try:
            if self.path is None:
                self._db = Database(memory=True, execute_plugins=False)
            elif read_only:
                self._db = connection.open_read_only(self.path, immutable)
            else:
                self._db = connection.open_writable(self.path)
            try:
                self._ensure_schema()
            except BaseException:
                self._db.conn.close()
                raise
        except sqlite3.Error as exc:
            # Not a lock and not corruption (those are handled): permissions, I/O, a directory.
            raise DatabaseError(f"cannot use tuning database {self._describe()}: {exc}") from exc

    @classmethod
    def open_user(cls) -> TuningDB:
        """Open the user's database (``settings.user_db_path()``) to write, creating it.

        Raises:
            DatabaseError: it cannot be created or written (a read-only file, directory or
                file system): tuning results cannot be stored there.

        """
        path = settings.user_db_path()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DatabaseError(
                f"cannot create the directory of tuning database {path}: {exc.strerror} "
                f"({exc.filename})"
            ) from exc
        return cls(path)

    @classmethod
    def open_user_to_read(cls) -> TuningDB | None:
        """Open the user's database to read its winners; None if there is none.

        Creates nothing. A file that cannot be written is opened read-only, with a
        :class:`~autonorm.errors.ReadOnlyDatabaseWarning` (once per process); a writable one
        is opened as :meth:`open_user` does (migrated, or set aside if corrupt).
        """
        path = settings.user_db_path()
        if not path.exists():
            return None
        if not path.is_file():
            raise DatabaseError(f"tuning database {path} is not a file")
        reason = connection.read_only_reason(path)
        if reason is None:
            return cls(path)
        connection.report_read_only(path, reason)
        return cls(path, read_only=True)

    @classmethod
    def open_shipped(cls) -> TuningDB | None:
        """Open the shipped database read-only, or return None if it is missing or disabled."""
        path = settings.shipped_db_path()
        if path is None or not path.is_file():
            return None
        return cls(path, read_only=True, immutable=True, source="shipped")

    def __enter__(self) -> TuningDB:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "read-only" if self.read_only else "writable"
        return f"TuningDB({str(self.path) if self.path else ':memory:'!r}, {mode})"

    def close(self) -> None:
        """Close the connection (idempotent)."""
        self._db.close()

    @property
    def db(self) -> Database:
        """The underlying sqlite-utils database, for ad-hoc read queries (reports)."""
        return self._db

    @property
    def schema_version(self) -> int | None:
        """The schema version stored in the file (None for a database without one)."""
        return schema.read_schema_version(self._db, self._describe())

    # -- devices ---------------------------------------------------------------------------

    def record_device(self, info: DeviceInfo) -> None:
        """Insert or update a device, keeping the time it was first seen."""
        props = {
            "fingerprint": info.fingerprint,
            "name": info.name,
            "cc": info.cc,
            "sm_count": info.sm_count,
            "l2_bytes": info.l2_bytes,
            "smem_optin": info.smem_optin,
            "mem_bus_bits": info.mem_bus_bits,
            "mem_clock_khz": info.mem_clock_khz,
            "regs_per_sm": info.regs_per_sm,
            "max_threads_per_sm": info.max_threads_per_sm,
            "smem_per_sm": info.smem_per_sm,
        }

        def write(db: Database) -> None:
            # Insert-or-ignore sets first_seen once; the update then refreshes the rest.
            db["devices"].insert({**props, "first_seen": records.utc_now()}, ignore=True)
            db["devices"].update(info.fingerprint, props)

        self._transact(write)

    def devices(self) -> list[dict]:
        """Return every recorded device as a dict of its columns, by fingerprint."""
        return list(self._db["devices"].rows_where(order_by="fingerprint"))

    def device_limits(self, fingerprint: str) -> DeviceLimits | None:
        """Return the limits of a recorded device (None if it is not recorded).

        A device recorded before schema 3 has no per-SM limits: those of
        :class:`DeviceLimits`' defaults stand in.
        """
        row = next(self._db["devices"].rows_where("fingerprint = ?", [fingerprint]), None)
        if row is None:
            return None
        per_sm = {c: int(row[c]) for c in schema.DEVICE_LIMIT_COLUMNS if row.get(c) is not None}
        return DeviceLimits(
            name=row["name"],
            cc=int(row["cc"]),
            sm_count=int(row["sm_count"]),
            max_smem_optin=int(row["smem_optin"]),
            l2_bytes=int(row["l2_bytes"]),
            **per_sm,
        )

    # -- trials ----------------------------------------------------------------------------

    def record_trial(
        self,
        key: TuningKey,
        config: dict,
        status: str,
        *,
        label: str | None = None,
        error: str | None = None,
        metrics: dict | None = None,
        study: str | None = None,
        trial_number: int | None = None,
    ) -> int:
        """Record one evaluated candidate and return its row id.

        Args:
            key: the problem it was evaluated for.
            config: the candidate's ``to_dict()`` (or any parameters, for a partial one).
            status: 'ok', or the failure class ('invalid', 'compile', 'launch',
                'verification').
            label: the candidate's short name; by default the family's label of ``config``
                when it is a whole configuration, else its ``k=v`` pairs.
            error: the failure message, if any.
            metrics: timing and accuracy (median_us, gbps, share, max_rel_err, ...), if any.
            study: the Optuna study it belongs to.
            trial_number: its Optuna trial number.

        Raises:
            ValueError: unknown status.
            DatabaseError: the database is read-only, or stayed locked.

        """
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
        columns = {name: (metrics or {}).get(name) for name in TRIAL_METRIC_COLUMNS}
        row = {
            **records.key_columns(key),
            "study": study,
            "trial_number": trial_number,
            "config": config,
            "label": label or records.label(key.op, config),
            "status": status,
            "error": error,
            "metrics": metrics,
            **columns,
            "created_at": records.utc_now(),
        }
        return self._transact(lambda db: db["trials"].insert(row).last_rowid)

    def record_outcome(
        self, key: TuningKey, config: Config, outcome: Outcome, *,
        study: str | None = None, trial_number: int | None = None,
    ) -> int:
        """Record one evaluated candidate from its outcome, with its timing when it has one.

        What a search's ``on_trial`` callback stores, so trials keep their timings for later
        comparison.
        """
        metrics = None
        if outcome.timing is not None:
            metrics = outcome.timing.metrics(max_rel_err=outcome.max_rel_err)
        return self.record_trial(key, config.to_dict(), outcome.status, label=config.label(),
                                 error=outcome.error, metrics=metrics, study=study,
                                 trial_number=trial_number)

    def trials(self, key: TuningKey | None = None) -> list[dict]:
        """Return recorded trials (all, or those of ``key``) in the order they were recorded.

        Each dict has the table's columns, with ``config`` and ``metrics`` decoded from JSON
        (``metrics`` is None when none was recorded).
        """
        where, args = records.key_filter(key, KEY_COLUMNS) if key else (None, None)
        rows = self._db["trials"].rows_where(where, args, order_by="id")
        return [records.decode_trial(row) for row in rows]

    # -- winners ---------------------------------------------------------------------------

    def set_winner(self, key: TuningKey, config: dict, metrics: dict, kernel: str) -> None:
        """Record ``config`` as the winner for ``key``, replacing any previous one.

        Args:
            key: what it was tuned for.
            config: the configuration's ``to_dict()``.
            metrics: what was measured (median_us, gbps, share, ...).
            kernel: :func:`autonorm.codegen.environment.kernel_digest` of the kernel that was
                timed (:func:`autonorm.lookup.kernel_of`): the winner is used only while its
                configuration renders that kernel.

        """
        if not kernel:
            raise ValueError("a winner needs the digest of its kernel")
        row = {**records.key_columns(key), "config": config, "metrics": metrics, "kernel": kernel,
               "legacy_version": None, "tuned_at": records.utc_now()}
        self._transact(lambda db: db["winners"].upsert(row, pk=KEY_COLUMNS))

    def get_winner(self, key: TuningKey) -> Winner | None:
        """Return the winner for exactly ``key``, or None."""
        where, args = records.key_filter(key, KEY_COLUMNS)
        row = next(self._db["winners"].rows_where(where, args, limit=1), None)
        return self._to_winner(row) if row else None

    def nearest_winner(self, key: TuningKey) -> Winner | None:
        """Return the winner of the same problem whose rows bucket is nearest ``key``'s.

        Same device, op and problem; see :meth:`winners_by_distance`. Returns None if no
        bucket of that problem has a winner.
        """
        return next(iter(self.winners_by_distance(key)), None)

    def winners_by_distance(self, key: TuningKey) -> list[Winner]:
        """Return every winner of ``key``'s device, op and problem, nearest bucket first.

        Nearest by the distance of the bucket exponents, a tie going to the larger bucket (a
        kernel tuned for more rows degrades more gracefully on fewer than the reverse: its
        grid only gets smaller). ``key``'s own bucket, if it has a winner, comes first.
        """
        where, args = records.key_filter(key, KEY_COLUMNS[:-1])
        rows = list(self._db["winners"].rows_where(where, args))
        target = math.log2(key.rows_bucket)
        rows.sort(key=lambda r: (abs(math.log2(r["rows_bucket"]) - target), -r["rows_bucket"]))
        return [self._to_winner(r) for r in rows]

    def winners(
        self, device: str | None = None, op: str | None = None, *, problem: str | None = None,
        dtype: str | None = None,
    ) -> list[Winner]:
        """Return every winner, by dtype, hidden size and bucket.

        Args:
            device: only this device's winners.
            op: only this family's winners.
            problem: only winners of this problem (its canonical JSON, as in the key).
            dtype: only winners of problems of this dtype, every hidden size and other field.

        """
        filters = {"device": device, "op": op, "problem": problem, "dtype": dtype}
        wanted = {column: value for column, value in filters.items() if value is not None}
        where = " AND ".join(f"[{column}] = ?" for column in wanted) or None
        order = "dtype, hidden, rows_bucket, device, op, problem"
        rows = self._db["winners"].rows_where(where, list(wanted.values()), order_by=order)
        return [self._to_winner(r) for r in rows]

    # -- internals -------------------------------------------------------------------------

    def _to_winner(self, row: dict) -> Winner:
        return Winner(
            key=TuningKey(*(row[c] for c in KEY_COLUMNS)),
            config=load_object(row["config"]),
            metrics=load_object(row["metrics"]),
            tuned_at=row["tuned_at"],
            source=self.source,
            kernel=row["kernel"],
            legacy_version=row["legacy_version"],
        )

    def _describe(self) -> str:
        return str(self.path) if self.path else "in-memory tuning database"

    def _ensure_schema(self) -> None:
        version = schema.read_schema_version(self._db, self._describe())
        if version == SCHEMA_VERSION:
            return
        if version is not None and version > SCHEMA_VERSION:
            raise schema.newer_schema_error(self._describe(), version)
        if self.read_only:
            what = f"schema version {version}" if version else "no autonorm schema"
            raise DatabaseError(
                f"tuning database {self._describe()} has {what} and cannot be upgraded "
                f"read-only (this autonorm uses schema version {SCHEMA_VERSION})"
            )
        self._transact(lambda db: schema.upgrade(db, self._describe()))

    def _require_writable(self) -> None:
        if self.read_only:
            raise DatabaseError(f"tuning database {self._describe()} is read-only")

    def _transact(self, body: Callable[[Database], _T]) -> _T:
        """Run ``body`` in one write transaction, retrying it while the file is locked."""
        self._require_writable()
        return connection.transact(self._db, body, self._describe())
