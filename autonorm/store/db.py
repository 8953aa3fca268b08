"""The tuning database: devices seen, every trial run, and the winning kernel per problem.

Two databases exist: the user's writable one (``config.user_db_path()``) and a read-only one
shipped with autonorm (``config.shipped_db_path()``). Both have the same schema, created and
queried through sqlite-utils.

Writable file databases use WAL journaling, a busy timeout and retries with backoff, so several
tuning processes can write one file at once without losing a row. A file that is not a valid
SQLite database is moved aside and replaced by a fresh one (with a warning); the shipped
database is opened with SQLite's ``mode=ro`` so it cannot be written even by accident.

Schema history (``meta.schema_version``):
    1: winners stored ``median_us`` and ``gbps`` columns; trials had no ``share`` or
       ``max_rel_err`` columns.
    2: winners store every metric in a ``metrics`` JSON column; trials gain ``share`` and
       ``max_rel_err`` columns.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import sqlite3
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from sqlite_utils import Database

from autonorm import settings as _config
from autonorm.dtypes import DTYPES
from autonorm.errors import CorruptDatabaseWarning, DatabaseError
from autonorm.ops.base import rows_bucket
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.problem import Problem
from autonorm.results import FAILURE_CLASSES, Outcome
from autonorm.runtime.device import DeviceInfo

SCHEMA_VERSION = 2

STATUSES: tuple[str, ...] = ("ok", *FAILURE_CLASSES)

KEY_COLUMNS: tuple[str, ...] = (
    "device",
    "version",
    "dtype",
    "hidden",
    "has_weight",
    "has_bias",
    "rows_bucket",
)

# Metrics copied out of a trial's metrics JSON into columns, so reports can sort and filter.
TRIAL_METRIC_COLUMNS: tuple[str, ...] = ("median_us", "gbps", "share", "max_rel_err")

# SQLite waits this long inside its own busy handler before reporting "database is locked".
BUSY_TIMEOUT_S = 5.0

# SQLite reports SQLITE_BUSY without calling the busy handler in a few cases (WAL recovery, a
# journal-mode change, a deferred transaction that cannot upgrade), so whole transactions are
# also retried, with exponential backoff and jitter so that contending processes spread out.
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
_SIDECAR_SUFFIXES = ("-wal", "-shm", "-journal")

_T = TypeVar("_T")


@dataclass(frozen=True)
class TuningKey:
    """What a winner is tuned for: one device, autonorm build, problem and row-count bucket.

    Attributes:
        device: the :attr:`autonorm.runtime.device.DeviceInfo.fingerprint` of the GPU.
        version: autonorm version + '+' + 12-hex hash of the templates, e.g.
            ``"0.1.0+ab12cd34ef56"``: a winner is only trusted for the code that was timed.
        dtype: 'float32', 'float16' or 'bfloat16'.
        hidden: elements per row.
        has_weight: the problem multiplies by a weight.
        has_bias: the problem adds a bias.
        rows_bucket: power-of-two bucket of the row count (:func:`autonorm.space.rows_bucket`).

    """

    device: str
    version: str
    dtype: str
    hidden: int
    has_weight: bool
    has_bias: bool
    rows_bucket: int

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.hidden < 1:
            raise ValueError(f"hidden must be positive, got {self.hidden}")
        if self.rows_bucket < 1 or self.rows_bucket & (self.rows_bucket - 1):
            raise ValueError(f"rows_bucket must be a power of two, got {self.rows_bucket}")

    @classmethod
    def for_problem(cls, device: str, version: str, problem: Problem, rows: int) -> TuningKey:
        """Return the key of ``problem`` at ``rows`` rows (bucketed) on a device and version."""
        return cls(
            device=device,
            version=version,
            dtype=problem.dtype,
            hidden=problem.hidden,
            has_weight=problem.has_weight,
            has_bias=problem.has_bias,
            rows_bucket=rows_bucket(rows),
        )


@dataclass(frozen=True)
class Winner:
    """The fastest verified configuration found for a :class:`TuningKey`.

    Attributes:
        key: what it was tuned for.
        config: :meth:`autonorm.space.KernelConfig.to_dict` of the configuration.
        metrics: median_us, p20_us, p80_us, cv, gbps, share, max_rel_err, rows (the row count
            it was timed at) and trials.
        tuned_at: when it was recorded, ISO-8601 UTC.
        source: 'user' or 'shipped': the database it was read from.

    """

    key: TuningKey
    config: dict
    metrics: dict
    tuned_at: str
    source: str


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
                self._db = self._open_read_only(immutable)
            else:
                self._db = self._open_writable()
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
        """Open the user's writable database (``config.user_db_path()``), creating it."""
        path = _config.user_db_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        return cls(path)

    @classmethod
    def open_shipped(cls) -> TuningDB | None:
        """Open the shipped database read-only, or return None if it is missing or disabled."""
        path = _config.shipped_db_path()
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
        return _read_schema_version(self._db)

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
        }

        def write(db: Database) -> None:
            # Insert-or-ignore sets first_seen once; the update then refreshes the rest.
            db["devices"].insert({**props, "first_seen": _utc_now()}, ignore=True)
            db["devices"].update(info.fingerprint, props)

        self._transact(write)

    def devices(self) -> list[dict]:
        """Return every recorded device as a dict of its columns, by fingerprint."""
        return list(self._db["devices"].rows_where(order_by="fingerprint"))

    # -- trials ----------------------------------------------------------------------------

    def record_trial(
        self,
        key: TuningKey,
        config: dict,
        status: str,
        *,
        error: str | None = None,
        metrics: dict | None = None,
        study: str | None = None,
        trial_number: int | None = None,
    ) -> int:
        """Record one evaluated candidate and return its row id.

        Args:
            key: the problem it was evaluated for.
            config: :meth:`KernelConfig.to_dict` of the candidate.
            status: 'ok', or the failure class ('invalid', 'compile', 'launch',
                'verification').
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
            **_key_columns(key),
            "study": study,
            "trial_number": trial_number,
            "config": config,
            "label": _label(config),
            "status": status,
            "error": error,
            "metrics": metrics,
            **columns,
            "created_at": _utc_now(),
        }
        return self._transact(lambda db: db["trials"].insert(row).last_rowid)

    def record_outcome(
        self, key: TuningKey, config: KernelConfig, outcome: Outcome, *,
        trial_number: int | None = None,
    ) -> int:
        """Record one evaluated candidate from its outcome, with its timing when it has one.

        What the tuner's ``on_trial`` callbacks store (the CLI's and the benchmark grid's), so
        trials keep their timings for later comparison.
        """
        metrics = None
        if outcome.timing is not None:
            metrics = outcome.timing.metrics(max_rel_err=outcome.max_rel_err)
        return self.record_trial(key, config.to_dict(), outcome.status, error=outcome.error,
                                 metrics=metrics, trial_number=trial_number)

    def trials(self, key: TuningKey | None = None) -> list[dict]:
        """Return recorded trials (all, or those of ``key``) in the order they were recorded.

        Each dict has the table's columns, with ``config`` and ``metrics`` decoded from JSON
        (``metrics`` is None when none was recorded) and the affine flags as bools.
        """
        where, args = _key_filter(key, KEY_COLUMNS) if key else (None, None)
        rows = self._db["trials"].rows_where(where, args, order_by="id")
        return [_decode_trial(row) for row in rows]

    # -- winners ---------------------------------------------------------------------------

    def set_winner(self, key: TuningKey, config: dict, metrics: dict) -> None:
        """Record ``config`` as the winner for ``key``, replacing any previous one."""
        row = {**_key_columns(key), "config": config, "metrics": metrics, "tuned_at": _utc_now()}
        self._transact(lambda db: db["winners"].upsert(row, pk=KEY_COLUMNS))

    def get_winner(self, key: TuningKey) -> Winner | None:
        """Return the winner for exactly ``key``, or None."""
        where, args = _key_filter(key, KEY_COLUMNS)
        row = next(self._db["winners"].rows_where(where, args, limit=1), None)
        return self._to_winner(row) if row else None

    def nearest_winner(self, key: TuningKey) -> Winner | None:
        """Return the winner of the same problem whose rows bucket is nearest ``key``'s.

        Same device, version, dtype, hidden size and affine flags; nearest by the distance of
        the bucket exponents, a tie going to the larger bucket (a kernel tuned for more rows
        degrades more gracefully on fewer than the reverse: its grid only gets smaller).
        Returns None if no bucket of that problem has a winner.
        """
        where, args = _key_filter(key, KEY_COLUMNS[:-1])
        rows = list(self._db["winners"].rows_where(where, args))
        if not rows:
            return None
        target = math.log2(key.rows_bucket)
        best = min(
            rows,
            key=lambda r: (abs(math.log2(r["rows_bucket"]) - target), -r["rows_bucket"]),
        )
        return self._to_winner(best)

    def winners(self, device: str | None = None) -> list[Winner]:
        """Return every winner (of one device, if given), by dtype, hidden size and bucket."""
        where, args = ("device = ?", [device]) if device is not None else (None, None)
        order = "dtype, hidden, rows_bucket, device, version, has_weight, has_bias"
        rows = self._db["winners"].rows_where(where, args, order_by=order)
        return [self._to_winner(r) for r in rows]

    # -- internals -------------------------------------------------------------------------

    def _to_winner(self, row: dict) -> Winner:
        return Winner(
            key=_key_from_row(row),
            config=json.loads(row["config"]),
            metrics=json.loads(row["metrics"]),
            tuned_at=row["tuned_at"],
            source=self.source,
        )

    def _describe(self) -> str:
        return str(self.path) if self.path else "in-memory tuning database"

    def _connect(self, target: str, *, uri: bool = False) -> sqlite3.Connection:
        try:
            return sqlite3.connect(target, timeout=BUSY_TIMEOUT_S, uri=uri)
        except sqlite3.Error as exc:
            raise DatabaseError(f"cannot open tuning database {self.path}: {exc}") from exc

    def _corruption_or_close(self, conn: sqlite3.Connection) -> str | None:
        """Return what is corrupt about an open file (None if sound); close it unless sound."""
        try:
            problem = _with_retries(lambda: _find_corruption(conn), self._describe())
        except BaseException:
            conn.close()
            raise
        if problem is not None:
            conn.close()
        return problem

    def _open_writable(self) -> Database:
        assert self.path is not None
        conn = self._connect(str(self.path))
        problem = self._corruption_or_close(conn)
        if problem is not None:
            aside = _set_aside(self.path)
            warnings.warn(
                f"tuning database {self.path} is corrupt ({problem}): moved it to {aside} and "
                "started a fresh one",
                CorruptDatabaseWarning,
                stacklevel=3,
            )
            conn = self._connect(str(self.path))
        db = Database(conn, execute_plugins=False)
        try:
            _with_retries(db.enable_wal, self._describe())
            # In WAL mode NORMAL is still crash-safe; a power cut can only lose the last trials.
            db.execute("PRAGMA synchronous=NORMAL")
        except BaseException:
            conn.close()
            raise
        return db

    def _open_read_only(self, immutable: bool) -> Database:
        assert self.path is not None
        if not self.path.is_file():
            raise DatabaseError(f"tuning database {self.path} does not exist")
        uri = self.path.resolve().as_uri() + "?mode=ro" + ("&immutable=1" if immutable else "")
        conn = self._connect(uri, uri=True)
        problem = self._corruption_or_close(conn)
        if problem is not None:
            raise DatabaseError(f"tuning database {self.path} is corrupt: {problem}")
        return Database(conn, execute_plugins=False)

    def _ensure_schema(self) -> None:
        version = _read_schema_version(self._db)
        if version == SCHEMA_VERSION:
            return
        if version is not None and version > SCHEMA_VERSION:
            raise _newer_schema_error(self._describe(), version)
        if self.read_only:
            what = f"schema version {version}" if version else "no autonorm schema"
            raise DatabaseError(
                f"tuning database {self._describe()} has {what} and cannot be upgraded "
                f"read-only (this autonorm uses schema version {SCHEMA_VERSION})"
            )
        self._transact(lambda db: _upgrade(db, self._describe()))

    def _require_writable(self) -> None:
        if self.read_only:
            raise DatabaseError(f"tuning database {self._describe()} is read-only")

    def _transact(self, body: Callable[[Database], _T]) -> _T:
        """Run ``body`` in one write transaction, retrying it while the file is locked."""
        self._require_writable()

        def attempt() -> _T:
            # IMMEDIATE takes the write lock up front, so SQLite's busy handler applies; a
            # deferred transaction could fail mid-way when another writer commits first.
            self._db.conn.execute("BEGIN IMMEDIATE")
            try:
                result = body(self._db)
                self._db.conn.execute("COMMIT")
            except BaseException:
                self._db.rollback()
                raise
            return result

        try:
            return _with_retries(attempt, self._describe())
        except sqlite3.Error as exc:
            raise DatabaseError(f"cannot write tuning database {self._describe()}: {exc}") from exc


def _create_schema(db: Database) -> None:
    """Create the current (v2) schema in an empty database."""
    db["meta"].create({"key": str, "value": str}, pk="key", if_not_exists=True)
    db["devices"].create(
        {
            "fingerprint": str,
            "name": str,
            "cc": int,
            "sm_count": int,
            "l2_bytes": int,
            "smem_optin": int,
            "mem_bus_bits": int,
            "mem_clock_khz": int,
            "first_seen": str,
        },
        pk="fingerprint",
        not_null=["name", "first_seen"],
        if_not_exists=True,
    )
    key_types = {
        "device": str,
        "version": str,
        "dtype": str,
        "hidden": int,
        "has_weight": bool,
        "has_bias": bool,
        "rows_bucket": int,
    }
    # "id" is INTEGER PRIMARY KEY: SQLite assigns increasing ids (the rowid).
    db["trials"].create(
        {
            "id": int,
            **key_types,
            "study": str,
            "trial_number": int,
            "config": str,
            "label": str,
            "status": str,
            "error": str,
            "metrics": str,
            "median_us": float,
            "gbps": float,
            "share": float,
            "max_rel_err": float,
            "created_at": str,
        },
        pk="id",
        not_null=[*KEY_COLUMNS, "config", "label", "status", "created_at"],
        if_not_exists=True,
    )
    db["trials"].create_index(KEY_COLUMNS, index_name="idx_trials_key", if_not_exists=True)
    db["winners"].create(
        {**key_types, "config": str, "metrics": str, "tuned_at": str},
        pk=KEY_COLUMNS,
        not_null=["config", "metrics", "tuned_at"],
        if_not_exists=True,
    )


def _migrate_v1_to_v2(db: Database) -> None:
    """Add trials.share and trials.max_rel_err; fold winners' metric columns into JSON."""
    trials = db["trials"]
    trials.add_column("share", float)
    trials.add_column("max_rel_err", float)
    # v1 kept every metric in the trial's JSON too: fill the new columns from it.
    db.execute(
        "UPDATE trials SET share = json_extract(metrics, '$.share'), "
        "max_rel_err = json_extract(metrics, '$.max_rel_err') WHERE json_valid(metrics)"
    )
    winners = db["winners"]
    winners.add_column("metrics", str)
    db.execute("UPDATE winners SET metrics = json_object('median_us', median_us, 'gbps', gbps)")
    winners.transform(drop={"median_us", "gbps"}, not_null={"metrics"})

# Migration from version N to N + 1, run in order inside one write transaction.
_MIGRATIONS: dict[int, Callable[[Database], None]] = {1: _migrate_v1_to_v2}


def _upgrade(db: Database, where: str) -> None:
    """Create or migrate the schema to SCHEMA_VERSION (inside a write transaction)."""
    # Read again under the write lock: another process may have upgraded meanwhile.
    version = _read_schema_version(db)
    if version == SCHEMA_VERSION:
        return
    if version is None:
        if db.table_names():
            raise DatabaseError(
                f"{where} is an SQLite database but not an autonorm tuning database "
                f"(tables: {', '.join(db.table_names())})"
            )
        _create_schema(db)
    elif version > SCHEMA_VERSION:
        raise _newer_schema_error(where, version)
    else:
        for step in range(version, SCHEMA_VERSION):
            _MIGRATIONS[step](db)
    db["meta"].upsert({"key": "schema_version", "value": str(SCHEMA_VERSION)}, pk="key")


def _read_schema_version(db: Database) -> int | None:
    if not db["meta"].exists():
        return None
    row = next(db["meta"].rows_where("key = ?", ["schema_version"]), None)
    if row is None:
        return None
    try:
        return int(row["value"])
    except (TypeError, ValueError):
        raise DatabaseError(f"unreadable schema_version {row['value']!r}") from None


def _newer_schema_error(where: str, version: int) -> DatabaseError:
    from autonorm import __version__

    return DatabaseError(
        f"tuning database {where} has schema version {version}, newer than the version "
        f"{SCHEMA_VERSION} that autonorm {__version__} understands: upgrade autonorm, or use "
        "another database file (AUTONORM_DB)"
    )


def _find_corruption(conn: sqlite3.Connection) -> str | None:
    """Return why the database is corrupt, or None if ``PRAGMA quick_check`` passes.

    Raises:
        sqlite3.Error: any failure other than corruption (a lock, an I/O error).

    """
    try:
        rows = conn.execute("PRAGMA quick_check").fetchall()
    except sqlite3.DatabaseError as exc:
        if _is_corruption(exc):
            return str(exc)
        raise
    if rows == [("ok",)]:
        return None
    return "; ".join(str(r[0]) for r in rows[:3])


def _set_aside(path: Path) -> Path:
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
    for suffix in _SIDECAR_SUFFIXES:
        sidecar = path.with_name(path.name + suffix)
        try:
            os.replace(sidecar, aside.with_name(aside.name + suffix))
        except FileNotFoundError:
            pass
    return aside


def _primary_code(exc: sqlite3.Error) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+
    return None if code is None else code & 0xFF


def _is_corruption(exc: sqlite3.Error) -> bool:
    code = _primary_code(exc)
    if code is not None:
        return code in (_SQLITE_CORRUPT, _SQLITE_NOTADB)
    message = str(exc)
    return "malformed" in message or "not a database" in message


def _is_locked(exc: sqlite3.Error) -> bool:
    code = _primary_code(exc)
    if code is not None:
        return code in (_SQLITE_BUSY, _SQLITE_LOCKED)
    return "locked" in str(exc) or "busy" in str(exc)


def _with_retries(action: Callable[[], _T], where: str) -> _T:
    """Run ``action``, retrying with backoff while SQLite says the database is locked."""
    delay = BACKOFF_START_S
    for attempt in range(MAX_ATTEMPTS):
        try:
            return action()
        except sqlite3.OperationalError as exc:
            if not _is_locked(exc):
                raise
            if attempt == MAX_ATTEMPTS - 1:
                raise DatabaseError(
                    f"tuning database {where} stayed locked through {MAX_ATTEMPTS} attempts: "
                    f"{exc}"
                ) from exc
        time.sleep(delay * (1.0 + random.random()))
        delay = min(delay * 2.0, BACKOFF_MAX_S)
    raise AssertionError("unreachable")  # pragma: no cover


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _key_columns(key: TuningKey) -> dict[str, Any]:
    return dataclasses.asdict(key)


def _key_filter(key: TuningKey, columns: tuple[str, ...]) -> tuple[str, list[Any]]:
    values = _key_columns(key)
    return " AND ".join(f"[{c}] = ?" for c in columns), [values[c] for c in columns]


def _key_from_row(row: dict) -> TuningKey:
    return TuningKey(
        device=row["device"],
        version=row["version"],
        dtype=row["dtype"],
        hidden=row["hidden"],
        has_weight=bool(row["has_weight"]),
        has_bias=bool(row["has_bias"]),
        rows_bucket=row["rows_bucket"],
    )


def _decode_trial(row: dict) -> dict:
    row = dict(row)
    row["has_weight"] = bool(row["has_weight"])
    row["has_bias"] = bool(row["has_bias"])
    row["config"] = json.loads(row["config"])
    row["metrics"] = json.loads(row["metrics"]) if row["metrics"] is not None else None
    return row


def _label(config: dict) -> str:
    """Return the configuration's short name; a partial config gets ``k=v`` pairs instead."""
    names = {f.name for f in dataclasses.fields(KernelConfig)}
    if names <= config.keys():
        return KernelConfig.from_dict(config).label()
    return ",".join(f"{k}={config[k]}" for k in sorted(config))
