"""Merging winners from elsewhere into a tuning database: what ``autonorm db import`` does.

:func:`merge` takes what :func:`autonorm.store.bundle.load` read (a winners file or another
autonorm database). An entry is refused unless this autonorm renders, for its configuration on
its GPU (the limits its file records, else this database's, else an H200's), the kernel that
was timed (:func:`autonorm.store.audit.judge`), and, with a verifier, unless its kernel
verifies again. Per key the faster winner stays (median time; a tie keeps the one already
there; a stored winner that lookup would not run is replaced). A winner that an import replaces
is kept in the trials table with its configuration and timing, as is each imported winner
(with its verification record), so nothing tuned is lost. The whole merge is one write
transaction of the database's own locked and retried path
(:func:`autonorm.store.connection.transact`).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sqlite_utils import Database

from autonorm import lookup
from autonorm.errors import DatabaseError
from autonorm.runtime.limits import DeviceLimits
from autonorm.store import audit, connection, records, schema
from autonorm.store.bundle import Bundle, Entry
from autonorm.store.db import TuningDB
from autonorm.store.keys import Winner

# Where an imported winner's trial row (and a replaced winner's) says it came from.
IMPORTED_STUDY = "imported"

REPLACED_STUDY = "replaced by an import"


@dataclass
class MergeReport:
    """What a merge did (or, dry, would do), key by key.

    ``refused`` holds (the entry in words, the reason counted, the detail) per refused entry.
    """

    added: list[Winner] = field(default_factory=list)
    replaced: list[Winner] = field(default_factory=list)
    kept: list[Winner] = field(default_factory=list)
    unchanged: list[Winner] = field(default_factory=list)
    refused: list[tuple[str, str, str]] = field(default_factory=list)

    def refusals(self) -> Counter:
        """How many entries were refused, by reason."""
        return Counter(reason for _, reason, _ in self.refused)


def merge(
    store: TuningDB, bundle: Bundle, *, dry_run: bool = False,
    verifier: audit.Verifier | None = None,
) -> MergeReport:
    """Merge ``bundle``'s winners into ``store`` (see the module docstring).

    Args:
        store: the database to merge into (writable unless ``dry_run``).
        bundle: what :func:`load` read.
        dry_run: decide, but write nothing.
        verifier: verifies each acceptable entry's kernel again before it counts.

    Raises:
        DatabaseError: ``store`` is read-only (and this is not a dry run), or stayed locked.

    """
    if store.read_only and not dry_run:
        raise DatabaseError(f"tuning database {store.path} is read-only: nothing can be "
                            "imported into it")
    report = MergeReport(refused=[(text, "unreadable", text) for text in bundle.unreadable])
    accepted: list[tuple[Entry, float | None]] = []
    for entry in bundle.entries:
        limits = _limits(store, entry)
        judgement = audit.judge(entry.winner, limits) if limits else audit.Judgement(
            audit.CORRUPT, "unreadable GPU record")
        if verifier is not None:
            judgement = audit.reverify(judgement, entry.winner, verifier)
        if judgement.status != lookup.USABLE:
            report.refused.append((_describe(entry.winner), _reason(judgement),
                                   judgement.detail))
            continue
        error = judgement.max_rel_err
        accepted.append((entry, error if error is not None
                         else _number(entry.verification, "max_rel_err")))

    def body(db: Database) -> None:
        for entry, error in accepted:
            _merge_one(store, db, entry, error, report, write=not dry_run)

    if dry_run:
        body(store.db)
    else:
        connection.transact(store.db, body, str(store.path or "in-memory tuning database"))
    return report


def _merge_one(store: TuningDB, db: Database, entry: Entry, error: float | None,
               report: MergeReport, *, write: bool) -> None:
    incoming = entry.winner
    key = incoming.key
    where, args = records.key_filter(key, schema.KEY_COLUMNS)
    row = next(db["winners"].rows_where(where, args, limit=1), None)
    existing = None
    if row is not None:
        try:
            existing = audit.decode_winner(row, store.source)
        except ValueError:
            existing = None
    if existing is not None and (existing.config, existing.kernel) == (incoming.config,
                                                                        incoming.kernel):
        report.unchanged.append(incoming)
        return
    if existing is not None and _holds(store, existing, entry, incoming):
        report.kept.append(existing)
        return
    (report.replaced if row is not None else report.added).append(incoming)
    if not write:
        return
    limits = _limits(store, entry)
    if entry.device is not None and limits is not None:
        # Only a GPU this database has not seen: what was recorded here stays.
        db["devices"].insert({**_device_row(entry.device, key.device, limits),
                              "first_seen": records.utc_now()}, ignore=True)
    if row is not None:
        db["trials"].insert(_trial_row(row, REPLACED_STUDY, None))
    winner_row = {**records.key_columns(key), "config": incoming.config,
                  "metrics": incoming.metrics, "kernel": incoming.kernel,
                  "legacy_version": incoming.legacy_version, "tuned_at": incoming.tuned_at}
    db["winners"].upsert(winner_row, pk=schema.KEY_COLUMNS)
    db["trials"].insert(_trial_row(winner_row, IMPORTED_STUDY, error))


def _holds(store: TuningDB, existing: Winner, entry: Entry, incoming: Winner) -> bool:
    """True when the winner already stored stays: usable here and at least as fast."""
    limits = _limits(store, entry)
    if limits is None or audit.judge(existing, limits).status != lookup.USABLE:
        return False  # lookup never runs it: the imported one is strictly better
    mine, theirs = _number(existing.metrics, "median_us"), _number(incoming.metrics, "median_us")
    if mine is None:
        return True  # no time to compare with: what the user has stays
    return theirs is None or theirs >= mine


def _limits(store: TuningDB, entry: Entry) -> DeviceLimits | None:
    """The limits of an entry's GPU: its record in the file, else the database's, else H200's."""
    if entry.device is None:
        return audit.limits_for(store, entry.winner.key.device)
    try:
        record = entry.device
        per_sm = {c: int(record[c]) for c in schema.DEVICE_LIMIT_COLUMNS
                  if record.get(c) is not None}
        return DeviceLimits(name=str(record["name"]), cc=int(record["cc"]),
                            sm_count=int(record["sm_count"]),
                            max_smem_optin=int(record["smem_optin"]),
                            l2_bytes=int(record["l2_bytes"]), **per_sm)
    except (KeyError, TypeError, ValueError):
        return None


def _trial_row(winner_row: dict[str, Any], study: str, error: float | None) -> dict[str, Any]:
    """A trials row that keeps a winner's configuration and timing (one that left or came)."""
    config, metrics = winner_row["config"], winner_row["metrics"]
    if isinstance(metrics, str):
        try:
            metrics = json.loads(metrics)
        except ValueError:
            metrics = {"unreadable": metrics}
    metrics = dict(metrics) if isinstance(metrics, dict) else {}
    if error is not None:
        metrics["max_rel_err"] = error
    try:
        label = records.label(winner_row["op"], json.loads(config) if isinstance(config, str)
                              else config)
    except (TypeError, ValueError):
        label = "unreadable configuration"
    return {
        **{c: winner_row[c] for c in (*schema.KEY_COLUMNS, "dtype", "hidden")},
        "legacy_version": winner_row.get("legacy_version"), "study": study,
        "trial_number": None, "config": config, "label": label, "status": "ok", "error": None,
        "metrics": metrics,
        **{c: _number(metrics, c) for c in schema.TRIAL_METRIC_COLUMNS},
        "created_at": records.utc_now(),
    }


def _device_row(record: dict[str, Any], fingerprint: str, limits: DeviceLimits
                ) -> dict[str, Any]:
    """A devices row from a GPU's record in a file: the limits it was judged by, as read."""
    extra = {c: v if isinstance(v := record.get(c), int) and not isinstance(v, bool) else None
             for c in ("mem_bus_bits", "mem_clock_khz")}
    return {"fingerprint": fingerprint, "name": limits.name, "cc": limits.cc,
            "sm_count": limits.sm_count, "l2_bytes": limits.l2_bytes,
            "smem_optin": limits.max_smem_optin,
            **{c: getattr(limits, c) for c in schema.DEVICE_LIMIT_COLUMNS}, **extra}


def _number(data: Any, name: str) -> float | None:
    """``data[name]`` if it is a finite number, else None."""
    value = data.get(name) if isinstance(data, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _describe(winner: Winner) -> str:
    key = winner.key
    return f"{key.op} {key.dtype} hidden {key.hidden} rows<={key.rows_bucket} on {key.device}"


def _reason(judgement: audit.Judgement) -> str:
    """The reason an entry was refused, as counted in the summary."""
    return {lookup.STALE: "another kernel version", lookup.INVALID: "refused by the rules",
            audit.FAILED: "failed verification"}.get(judgement.status, "unreadable")
