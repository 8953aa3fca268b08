"""untuned.py's records (no GPU): one a shape, its shares of copy and its speed over the peers."""

from __future__ import annotations

from .untuned_constants import PEER_NAMES, UNTUNED
from .untuned_shapes import Case


def autonorm_key(mode: str) -> str:
    """The record key of autonorm in a mode."""
    return f"autonorm:{mode}"


def new_record(case: Case) -> dict:
    shape = case.shape()
    return {"dtype": case.dtype, "hidden": case.hidden, "rows": case.rows, "kind": case.kind,
            "odd": case.odd, "bytes": shape.bytes, "copy_bytes": shape.copy_bytes,
            "status": "ok", "impls": {}}


def new_impl() -> dict:
    # status: ok | WRONG | error | unavailable | skipped (as peers.py's records)
    return {"status": "error", "us": None, "us_p20": None, "us_p80": None, "gbps": None,
            "share": None, "rel_err": None, "offset_err": None, "choice": None,
            "poisoned": None, "first_call_s": None, "error": None}


def set_shares(records: list[dict], rates: dict[tuple[int, str], float]) -> None:
    """Share of copy of each bulk measurement: its GB/s over the same bytes' read-flush copy."""
    for rec in records:
        copy = rates.get((rec["copy_bytes"], "read")) if rec["kind"] == "bulk" else None
        for r in rec["impls"].values():
            r["share"] = r["gbps"] / copy if (copy and r["gbps"]) else None


def derive(rec: dict, modes: list[str]) -> None:
    """Add the best peer, autonorm's speed over it per mode, and untuned over tuned speed."""
    ok = [(n, rec["impls"][n]) for n in PEER_NAMES if n in rec["impls"]]
    ok = [(n, r) for n, r in ok if r["status"] == "ok" and r["us"]]
    best = min(ok, key=lambda nr: nr[1]["us"], default=(None, None))
    rec["best_peer"] = best[0]
    rec["best_peer_us"] = best[1]["us"] if best[1] else None
    rec["best_peer_share"] = best[1]["share"] if best[1] else None
    rec["ratio"] = {}
    for mode in modes:
        r = rec["impls"].get(autonorm_key(mode))
        good = r is not None and r["status"] == "ok" and r["us"]
        rec["ratio"][mode] = rec["best_peer_us"] / r["us"] if good and best[1] else None
    untuned = rec["impls"].get(autonorm_key(UNTUNED))
    tuned = rec["impls"].get(autonorm_key("tuned"))
    both = all(r is not None and r["status"] == "ok" and r["us"] for r in (untuned, tuned))
    rec["untuned_over_tuned"] = tuned["us"] / untuned["us"] if both else None
