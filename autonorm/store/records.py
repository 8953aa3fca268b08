"""How the tuning database's rows are made and read: key columns, filters, trials, labels.

Plain functions over dicts, shared by :class:`autonorm.store.db.TuningDB`'s methods.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from autonorm.store.keys import TuningKey
from autonorm.store.schema import KEY_COLUMNS


def utc_now() -> str:
    """The time of a row, ISO-8601 UTC to the second."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def key_columns(key: TuningKey) -> dict[str, Any]:
    """The key's columns, and the plain dtype and hidden columns beside them."""
    columns = {column: getattr(key, column) for column in KEY_COLUMNS}
    return {**columns, "dtype": key.dtype, "hidden": key.hidden}


def key_filter(key: TuningKey, columns: tuple[str, ...]) -> tuple[str, list[Any]]:
    """A WHERE clause and its arguments matching ``key`` on ``columns``."""
    return " AND ".join(f"[{c}] = ?" for c in columns), [getattr(key, c) for c in columns]


def decode_trial(row: dict) -> dict:
    """A trial row with its ``config`` and ``metrics`` decoded from JSON."""
    row = dict(row)
    row["config"] = json.loads(row["config"])
    row["metrics"] = json.loads(row["metrics"]) if row["metrics"] is not None else None
    return row


def label(op: str, config: dict) -> str:
    """Return the family's label of a whole configuration; other dicts get ``k=v`` pairs."""
    from autonorm.ops import registry

    try:
        whole = registry.get(op).config_from_dict(config)
        if whole.to_dict() == config:
            return whole.label()
    except (KeyError, TypeError, ValueError):
        pass  # an unknown op, or parameters that make no configuration
    return ",".join(f"{k}={config[k]}" for k in sorted(config))
