"""What the tuning database stores a winner under, and what it hands back.

A winner is tuned for one device, one kernel family (its op), one problem of that family and
one power-of-two bucket of the row count. The problem is the canonical JSON of its fields
(:func:`autonorm.ops.base.problem_key`), so a key is plain data, written and compared without
the family that defines it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from autonorm.dtypes import DTYPES
from autonorm.ops.base import Problem, problem_key, rows_bucket


@dataclass(frozen=True)
class TuningKey:
    """What a winner is tuned for: a device, an op, a problem and a row-count bucket.

    Attributes:
        device: the :attr:`autonorm.runtime.device.DeviceInfo.fingerprint` of the GPU.
        op: the kernel family's name (:attr:`autonorm.ops.base.Family.op`).
        problem: the canonical JSON of the problem's fields
            (:func:`autonorm.ops.base.problem_key`); it holds ``dtype`` and ``hidden``.
        rows_bucket: power-of-two bucket of the row count (:func:`autonorm.ops.base.rows_bucket`).

    """

    device: str
    op: str
    problem: str
    rows_bucket: int

    def __post_init__(self) -> None:
        if not self.op:
            raise ValueError("op must be a family's name, got an empty string")
        try:
            fields = json.loads(self.problem)
        except (TypeError, ValueError):
            raise ValueError(f"problem must be JSON, got {self.problem!r}") from None
        if not isinstance(fields, dict):
            raise ValueError(f"problem must be a JSON object, got {self.problem!r}")
        if _canonical(fields) != self.problem:
            raise ValueError(f"problem must be canonical JSON (problem_key), got {self.problem!r}")
        if fields.get("dtype") not in DTYPES:
            raise ValueError(f"problem dtype must be one of {DTYPES}, got {fields.get('dtype')!r}")
        hidden = fields.get("hidden")
        if not isinstance(hidden, int) or isinstance(hidden, bool) or hidden < 1:
            raise ValueError(f"problem hidden size must be a positive integer, got {hidden!r}")
        if self.rows_bucket < 1 or self.rows_bucket & (self.rows_bucket - 1):
            raise ValueError(f"rows_bucket must be a power of two, got {self.rows_bucket}")

    @classmethod
    def for_problem(cls, device: str, problem: Problem, rows: int) -> TuningKey:
        """Return the key of ``problem`` at ``rows`` rows (bucketed) on a device."""
        return cls(
            device=device,
            op=type(problem).op,
            problem=problem_key(problem),
            rows_bucket=rows_bucket(rows),
        )

    @property
    def fields(self) -> dict[str, Any]:
        """The problem's fields (a fresh dict: ``hidden``, ``dtype`` and the family's own)."""
        return json.loads(self.problem)

    @property
    def dtype(self) -> str:
        """The problem's dtype."""
        return self.fields["dtype"]

    @property
    def hidden(self) -> int:
        """The problem's hidden size."""
        return self.fields["hidden"]


@dataclass(frozen=True)
class Winner:
    """The fastest verified configuration found for a :class:`TuningKey`.

    Attributes:
        key: what it was tuned for.
        config: the configuration's ``to_dict()``.
        metrics: median_us, p20_us, p80_us, cv, gbps, share, max_rel_err, rows (the row count
            it was timed at) and trials.
        tuned_at: when it was recorded, ISO-8601 UTC.
        source: 'user' or 'shipped': the database it was read from.
        kernel: :func:`autonorm.codegen.environment.kernel_digest` of the kernel that was
            timed; None for a winner migrated from a database of schema 2 or older.
        legacy_version: for a migrated winner, the version string (package version and
            template hash) of the autonorm that tuned it; None otherwise.

    """

    key: TuningKey
    config: dict
    metrics: dict
    tuned_at: str
    source: str
    kernel: str | None = None
    legacy_version: str | None = None


def load_object(text: str | None) -> dict:
    """Return a stored JSON object, or {} where the text is none (a damaged row).

    A winner whose configuration cannot be read then describes no kernel that lookup would run
    (its digest never matches), so a damaged row costs its winner, never the caller's launch.
    """
    try:
        value = json.loads(text) if text is not None else None
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _canonical(fields: dict[str, Any]) -> str:
    return json.dumps(fields, sort_keys=True, separators=(",", ":"))
