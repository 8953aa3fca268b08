"""A standalone copy of a tuning database: how the shipped database is written.

The shipped database is opened read-only and immutable, so it must stand alone: one file in
rollback-journal mode (not WAL, whose committed pages may still sit in a ``-wal`` file), with
no free pages. A tuning run writes the user database in WAL mode; :func:`write_snapshot` copies
what dispatch needs from it into such a file.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from sqlite_utils import Database

from autonorm.store import schema
from autonorm.store.db import TuningDB


def write_snapshot(source: TuningDB, dest: str | Path, *, trials: bool = False) -> Path:
    """Write the devices and winners of ``source`` (its trials too, if asked) to ``dest``.

    The file is built beside ``dest`` and renamed over it at the end, so a reader never sees
    half of it.

    Args:
        source: an open database of the current schema.
        dest: the file to write (replaced if it exists).
        trials: copy the trials as well (the shipped database has none: dispatch never reads
            them, and they are most of a tuning database's size).

    Returns:
        ``dest`` as a path.

    """
    dest = Path(dest)
    building = dest.with_name(dest.name + ".building")
    building.unlink(missing_ok=True)
    conn = sqlite3.connect(building)
    try:
        conn.execute("PRAGMA journal_mode=DELETE")
        db = Database(conn, execute_plugins=False)
        schema.create_schema(db)
        db["meta"].insert({"key": "schema_version", "value": str(schema.SCHEMA_VERSION)})
        db["devices"].insert_all(source.devices())
        db["winners"].insert_all(source.db["winners"].rows_where(order_by="rowid"))
        if trials:
            db["trials"].insert_all(source.db["trials"].rows_where(order_by="id"))
        conn.commit()
        conn.execute("VACUUM")
    finally:
        conn.close()
    os.replace(building, dest)
    return dest
