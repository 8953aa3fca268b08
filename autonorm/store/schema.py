"""The tuning database's tables: how they are created, and how older files are migrated.

Schema history (``meta.schema_version``):
    1: winners stored ``median_us`` and ``gbps`` columns; trials had no ``share`` or
       ``max_rel_err`` columns.
    2: winners store every metric in a ``metrics`` JSON column; trials gain ``share`` and
       ``max_rel_err`` columns.
    3: trials and winners are keyed by (device, op, problem, rows_bucket), ``problem`` being the
       canonical JSON of the family's problem fields (:func:`autonorm.ops.base.problem_key`);
       ``dtype`` and ``hidden`` stay as plain columns for display and ordering. A winner
       records ``kernel``, the digest of the code its configuration renders
       (:func:`autonorm.codegen.environment.kernel_digest`), instead of a template hash in its
       key; the version string of older rows is kept as ``legacy_version``. Devices gain the
       per-SM limits that rendering reads (registers, threads, shared memory).

The migration to 3 keeps every row: schema 2 knew one op, LayerNorm forward, whose problem was
(dtype, hidden, has_weight, has_bias). Where old winners of several versions share one new key,
the most recently tuned one becomes the winner and the others move, unchanged, to the table
``winners_v2``. Migrated winners have no ``kernel``: lookup trusts one only if its family lists
its ``legacy_version`` as rendering the kernels it has today (docs/tuning.md).
"""

from __future__ import annotations

from collections.abc import Callable

from sqlite_utils import Database

from autonorm.errors import DatabaseError

SCHEMA_VERSION = 3

KEY_COLUMNS: tuple[str, ...] = ("device", "op", "problem", "rows_bucket")

# Metrics copied out of a trial's metrics JSON into columns, so reports can sort and filter.
TRIAL_METRIC_COLUMNS: tuple[str, ...] = ("median_us", "gbps", "share", "max_rel_err")

# The device limits that rendering reads beyond the fingerprint's fields (schema 3 on).
DEVICE_LIMIT_COLUMNS: tuple[str, ...] = ("regs_per_sm", "max_threads_per_sm", "smem_per_sm")

_KEY_TYPES: dict[str, type] = {
    "device": str,
    "op": str,
    "problem": str,
    "rows_bucket": int,
    "dtype": str,
    "hidden": int,
}

# The only op of schema 2 and the canonical JSON of its problem, written by SQLite: compact
# separators and sorted keys, as problem_key() writes it.
_V2_OP = "layer_norm"

_V2_PROBLEM = (
    "json_object('dtype', dtype, "
    "'has_bias', json(CASE WHEN has_bias THEN 'true' ELSE 'false' END), "
    "'has_weight', json(CASE WHEN has_weight THEN 'true' ELSE 'false' END), "
    "'hidden', hidden)"
)

_V2_KEY = ("device", "dtype", "hidden", "has_weight", "has_bias", "rows_bucket")


def create_schema(db: Database) -> None:
    """Create the current schema in an empty database."""
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
            **{column: int for column in DEVICE_LIMIT_COLUMNS},
            "first_seen": str,
        },
        pk="fingerprint",
        not_null=["name", "first_seen"],
        if_not_exists=True,
    )
    _create_trials(db, "trials")
    db["trials"].create_index(KEY_COLUMNS, index_name="idx_trials_key", if_not_exists=True)
    _create_winners(db, "winners")


def _create_trials(db: Database, name: str) -> None:
    # "id" is INTEGER PRIMARY KEY: SQLite assigns increasing ids (the rowid).
    db[name].create(
        {
            "id": int,
            **_KEY_TYPES,
            "legacy_version": str,
            "study": str,
            "trial_number": int,
            "config": str,
            "label": str,
            "status": str,
            "error": str,
            "metrics": str,
            **{column: float for column in TRIAL_METRIC_COLUMNS},
            "created_at": str,
        },
        pk="id",
        not_null=[*_KEY_TYPES, "config", "label", "status", "created_at"],
        if_not_exists=True,
    )


def _create_winners(db: Database, name: str) -> None:
    db[name].create(
        {
            **_KEY_TYPES,
            "config": str,
            "metrics": str,
            "kernel": str,
            "legacy_version": str,
            "tuned_at": str,
        },
        pk=KEY_COLUMNS,
        not_null=[*_KEY_TYPES, "config", "metrics", "tuned_at"],
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


def _migrate_v2_to_v3(db: Database) -> None:
    """Key trials and winners by (device, op, problem, rows_bucket); see the module docstring."""
    for column in DEVICE_LIMIT_COLUMNS:
        db["devices"].add_column(column, int)

    _create_trials(db, "trials_v3")
    trial_columns = ("study", "trial_number", "config", "label", "status", "error", "metrics",
                     *TRIAL_METRIC_COLUMNS, "created_at")
    db.execute(
        "INSERT INTO trials_v3 (id, device, op, problem, rows_bucket, dtype, hidden, "
        f"legacy_version, {', '.join(trial_columns)}) "
        f"SELECT id, device, '{_V2_OP}', {_V2_PROBLEM}, rows_bucket, dtype, hidden, version, "
        f"{', '.join(trial_columns)} FROM trials ORDER BY id"
    )
    db.execute("DROP TABLE trials")
    db.execute("ALTER TABLE trials_v3 RENAME TO trials")
    db["trials"].create_index(KEY_COLUMNS, index_name="idx_trials_key")

    # Rank the old winners of each new key, most recently tuned first.
    db.execute(
        "CREATE TEMP TABLE ranked AS SELECT *, ROW_NUMBER() OVER (PARTITION BY "
        f"{', '.join(_V2_KEY)} ORDER BY tuned_at DESC, version DESC) AS rank FROM winners"
    )
    _create_winners(db, "winners_v3")
    db.execute(
        "INSERT INTO winners_v3 (device, op, problem, rows_bucket, dtype, hidden, config, "
        "metrics, kernel, legacy_version, tuned_at) "
        f"SELECT device, '{_V2_OP}', {_V2_PROBLEM}, rows_bucket, dtype, hidden, config, "
        "metrics, NULL, version, tuned_at FROM ranked WHERE rank = 1"
    )
    db.execute(
        "CREATE TABLE winners_v2 AS SELECT device, version, dtype, hidden, has_weight, has_bias, "
        "rows_bucket, config, metrics, tuned_at FROM ranked WHERE rank > 1"
    )
    db.execute("DROP TABLE ranked")
    db.execute("DROP TABLE winners")
    db.execute("ALTER TABLE winners_v3 RENAME TO winners")


# Migration from version N to N + 1, run in order inside one write transaction.
MIGRATIONS: dict[int, Callable[[Database], None]] = {1: _migrate_v1_to_v2, 2: _migrate_v2_to_v3}


def upgrade(db: Database, where: str) -> None:
    """Create or migrate the schema to SCHEMA_VERSION (inside a write transaction)."""
    # Read again under the write lock: another process may have upgraded meanwhile.
    version = read_schema_version(db, where)
    if version == SCHEMA_VERSION:
        return
    if version is None:
        if db.table_names():
            raise DatabaseError(
                f"{where} is an SQLite database but not an autonorm tuning database "
                f"(tables: {', '.join(db.table_names())})"
            )
        create_schema(db)
    elif version > SCHEMA_VERSION:
        raise newer_schema_error(where, version)
    else:
        for step in range(version, SCHEMA_VERSION):
            MIGRATIONS[step](db)
    db["meta"].upsert({"key": "schema_version", "value": str(SCHEMA_VERSION)}, pk="key")


def read_schema_version(db: Database, where: str = "?") -> int | None:
    """Return the schema version stored in ``db`` (None for a database without one).

    Raises:
        DatabaseError: the stored version is not a number (the message names ``where``).

    """
    if not db["meta"].exists():
        return None
    row = next(db["meta"].rows_where("key = ?", ["schema_version"]), None)
    if row is None:
        return None
    try:
        return int(row["value"])
    except (TypeError, ValueError):
        raise DatabaseError(
            f"tuning database {where} has an unreadable schema_version {row['value']!r} "
            "(not a number)"
        ) from None


def newer_schema_error(where: str, version: int) -> DatabaseError:
    """Return the error for a file written by a newer autonorm."""
    return DatabaseError(
        f"tuning database {where} has schema version {version}, newer than the version "
        f"{SCHEMA_VERSION} that this autonorm understands: upgrade autonorm, or use another "
        "database file (AUTONORM_DB)"
    )
