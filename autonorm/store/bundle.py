"""The portable winners file: what it holds, how it is sealed, and how one is read.

:func:`export_document` writes the winners of a tuning database (or a filter of them) as a
JSON document with what a receiver needs to trust each one: the GPU's fingerprint, name and
recorded limits, the op, problem, rows bucket and configuration, the digest of the kernel that
was timed (:attr:`autonorm.store.keys.Winner.kernel`), the timings, when it was tuned, and the
verification record (the winning trial's error against float64) where one is stored. A SHA-256
over the canonical JSON of the whole document (``sha256`` left out) seals it.

:func:`load` reads such a file, refusing it whole when it is tampered, unsealed, of another
format or of an unknown format version, or reads another autonorm database's winners the same
way. What an entry is worth here is :mod:`autonorm.store.transfer`'s question.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autonorm import __version__
from autonorm.errors import AutonormError
from autonorm.store import audit, records, schema
from autonorm.store.db import TuningDB
from autonorm.store.keys import TuningKey, Winner

FORMAT = "autonorm-winners"

FORMAT_VERSION = 1

# A GPU's columns in the devices table that travel with its winners.
DEVICE_COLUMNS = ("fingerprint", "name", "cc", "sm_count", "l2_bytes", "smem_optin",
                  "mem_bus_bits", "mem_clock_khz", *schema.DEVICE_LIMIT_COLUMNS)

# The first bytes of every SQLite file: another database, not a winners file.
_SQLITE_MAGIC = b"SQLite format 3\x00"


class TransferError(AutonormError):
    """A winners file or database cannot be imported (tampered, unknown format, unreadable)."""


@dataclass(frozen=True)
class Entry:
    """One winner to import, with its GPU's record and verification record (if any)."""

    winner: Winner
    device: dict[str, Any] | None
    verification: dict[str, Any] | None


@dataclass
class Bundle:
    """What a winners file or database offers: its entries, and those it could not read."""

    where: str
    entries: list[Entry] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)


def canonical(document: dict[str, Any]) -> str:
    """The canonical JSON of a document without its seal (what the SHA-256 is taken over)."""
    body = {k: v for k, v in document.items() if k != "sha256"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def seal(document: dict[str, Any]) -> str:
    """The SHA-256 of a document's canonical JSON."""
    return hashlib.sha256(canonical(document).encode()).hexdigest()


def export_document(
    store: TuningDB, *, op: str | None = None, dtype: str | None = None,
    hidden: int | None = None, device: str | None = None,
) -> dict[str, Any]:
    """Return the sealed document of ``store``'s winners (those that match every filter).

    Args:
        store: the database to export.
        op: only this family's winners.
        dtype: only winners of this dtype.
        hidden: only winners of this hidden size.
        device: only winners of GPUs whose fingerprint contains this text (case-insensitive).

    Raises:
        TransferError: a winner's row cannot be read (``autonorm db check`` says which).

    """
    devices = {row["fingerprint"]: row for row in store.devices()}
    winners, used = [], {}
    rows = store.db["winners"].rows_where(order_by="dtype, hidden, rows_bucket, device, op")
    for row in rows:
        try:
            winner = audit.decode_winner(row, store.source)
        except ValueError as exc:
            raise TransferError(f"cannot export a winner of {row.get('device')} "
                                f"{row.get('problem')}: {exc} (see `autonorm db check`)") from None
        key = winner.key
        if ((op and key.op != op) or (dtype and key.dtype != dtype)
                or (hidden and key.hidden != hidden)
                or (device and device.lower() not in key.device.lower())):
            continue
        record = devices.get(key.device)
        if record is not None:
            used[key.device] = {c: record.get(c) for c in DEVICE_COLUMNS}
        winners.append({
            "device": key.device,
            "device_name": record["name"] if record else key.device.split("|")[0],
            "op": key.op, "problem": key.fields, "rows_bucket": key.rows_bucket,
            "config": winner.config, "kernel": winner.kernel,
            "legacy_version": winner.legacy_version, "metrics": winner.metrics,
            "verification": _verification_of(store, winner), "tuned_at": winner.tuned_at,
        })
    document = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "autonorm_version": __version__,
        "schema_version": schema.SCHEMA_VERSION, "exported_at": records.utc_now(),
        "devices": [used[fp] for fp in sorted(used)], "winners": winners,
    }
    document["sha256"] = seal(document)
    return document


def dump(document: dict[str, Any]) -> str:
    """The text of a winners file."""
    return json.dumps(document, indent=1, sort_keys=True) + "\n"


def load(path: Path) -> Bundle:
    """Read a winners file or another autonorm database as a :class:`Bundle`.

    Raises:
        TransferError: the file cannot be read, is tampered, unsealed, of another format or
            of an unknown format version.
        DatabaseError: an SQLite file that is not a usable autonorm database.

    """
    try:
        with path.open("rb") as handle:
            head = handle.read(len(_SQLITE_MAGIC))
    except OSError as exc:
        raise TransferError(f"cannot read {path}: {exc.strerror or exc}") from None
    if head == _SQLITE_MAGIC:
        return _load_database(path)
    try:
        document = json.loads(path.read_text())
    except (UnicodeDecodeError, ValueError) as exc:
        raise TransferError(f"{path} is neither a winners file (JSON) nor an autonorm "
                            f"database: {exc}") from None
    return parse_document(document, str(path))


def parse_document(document: Any, where: str) -> Bundle:
    """Check a winners document's format, version and seal, and read its entries."""
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise TransferError(f"{where} is not an autonorm winners file (format {FORMAT!r})")
    version = document.get("format_version")
    if version != FORMAT_VERSION:
        raise TransferError(
            f"{where} has winners file format version {version!r}; this autonorm reads "
            f"version {FORMAT_VERSION} only (it was written by autonorm "
            f"{document.get('autonorm_version')!s}: export the winners again with this one)")
    stated = document.get("sha256")
    if not isinstance(stated, str) or stated != seal(document):
        raise TransferError(f"{where} has been modified since it was exported: its SHA-256 "
                            "does not match its content; refusing all of it")
    devices, winners = document.get("devices"), document.get("winners")
    if not isinstance(devices, list) or not isinstance(winners, list):
        raise TransferError(f"{where} has no lists of devices and winners")
    records_of = {d.get("fingerprint"): d for d in devices if isinstance(d, dict)}
    bundle = Bundle(where)
    for index, item in enumerate(winners):
        try:
            winner = _winner_of(item)
        except (KeyError, TypeError, ValueError) as exc:
            bundle.unreadable.append(f"entry {index}: {exc}")
            continue
        verification = item.get("verification")
        bundle.entries.append(Entry(winner, records_of.get(winner.key.device),
                                    verification if isinstance(verification, dict) else None))
    return bundle


def _winner_of(item: Any) -> Winner:
    """Read one entry of a winners document."""
    if not isinstance(item, dict):
        raise TypeError("not a JSON object")
    problem = json.dumps(item["problem"], sort_keys=True, separators=(",", ":"))
    key = TuningKey(item["device"], item["op"], problem, item["rows_bucket"])
    row = {**records.key_columns(key), "config": json.dumps(item["config"]),
           "metrics": json.dumps(item["metrics"]), "kernel": item.get("kernel"),
           "legacy_version": item.get("legacy_version"), "tuned_at": item.get("tuned_at")}
    return audit.decode_winner(row, "import")


def _load_database(path: Path) -> Bundle:
    with TuningDB(path, read_only=True, source="import") as other:
        devices = {row["fingerprint"]: row for row in other.devices()}
        bundle = Bundle(str(path))
        for finding in audit.check_winners(other):
            winner = finding.winner
            if winner is None:
                bundle.unreadable.append(f"{finding.row.get('device')} "
                                         f"{finding.row.get('problem')}: "
                                         f"{finding.judgement.detail}")
                continue
            record = devices.get(winner.key.device)
            bundle.entries.append(Entry(winner, record, _verification_of(other, winner)))
    return bundle


def _verification_of(store: TuningDB, winner: Winner) -> dict[str, Any] | None:
    """The latest passing trial of the winner's configuration: its error against float64."""
    where, args = records.key_filter(winner.key, schema.KEY_COLUMNS)
    rows = store.db["trials"].rows_where(f"{where} AND status = 'ok'", args, order_by="id desc")
    for row in rows:
        try:
            if json.loads(row["config"]) != winner.config:
                continue
        except (TypeError, ValueError):
            continue
        if row.get("max_rel_err") is None:
            continue
        return {"passed": True, "max_rel_err": row["max_rel_err"], "at": row["created_at"],
                "study": row.get("study")}
    return None
