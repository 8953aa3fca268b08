"""untuned.py's summary figures (no GPU): whether shapes nobody tuned are fast, with targets."""

from __future__ import annotations

import math

from .untuned_constants import ODD_FROM, OFFSET_MEAN, OFFSET_SPREAD, OFFSET_TOL, UNTUNED
from .untuned_records import autonorm_key


def geo_mean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def _figure(name: str, pairs: list[tuple[str, float | None]], how: str, target: float,
            higher: bool) -> dict:
    """One summary figure over (shape label, value) pairs; None values count as missing."""
    have = [(w, v) for w, v in pairs if v is not None]
    value = where = None
    if have and how == "geo":
        value = geo_mean([v for _, v in have])
    elif have:
        worst = min(have, key=lambda wv: wv[1]) if higher else max(have, key=lambda wv: wv[1])
        where, value = worst
    missing = len(pairs) - len(have)
    met = None
    if pairs:
        met = value is not None and not missing and (value >= target if higher else
                                                     value <= target)
    return {"figure": name, "value": value, "target": target,
            "better": "higher" if higher else "lower", "n": len(pairs), "missing": missing,
            "where": where, "met": met}


def _where(rec: dict) -> str:
    return f"{rec['dtype']} h={rec['hidden']} rows={rec['rows']}"


def summarize(records: list[dict], modes: list[str]) -> list[dict]:
    """The figures of a run that say whether shapes nobody tuned are fast, with their targets.

    Each is a dict: figure, value, target, better (higher or lower), n (shapes), missing
    (shapes without a value: a failure, or a shape --budget-s skipped; a figure with any is not
    met), where (the worst shape) and met (None when the run has no shape for it).
    """
    bulk = [r for r in records if r["kind"] == "bulk"]
    small = [r for r in records if r["kind"] == "small"]
    even = [r for r in bulk if not r["odd"]]
    odd = [r for r in bulk if r["odd"] and r["hidden"] >= ODD_FROM]

    def ratios(recs: list[dict], mode: str) -> list[tuple[str, float | None]]:
        return [(_where(r), r["ratio"].get(mode)) for r in recs] if mode in modes else []

    def shares(recs: list[dict], mode: str) -> list[tuple[str, float | None]]:
        if mode not in modes:
            return []
        out = []
        for r in recs:
            share = r["impls"].get(autonorm_key(mode), {}).get("share")
            out.append((_where(r), None if share is None else share * 100))
        return out

    fp32 = [(_where(r), x.get("offset_err")) for r in records if r["dtype"] == "fp32"
            for k, x in r["impls"].items() if k.startswith("autonorm:")]
    tuned = [(_where(r), r["untuned_over_tuned"]) for r in even] if "tuned" in modes else []
    return [
        _figure("untuned, multiple of 8: worst speed over the best peer",
                ratios(even, UNTUNED), "worst", 1.0, True),
        _figure("untuned, multiple of 8: geo-mean speed over the best peer",
                ratios(even, UNTUNED), "geo", 1.15, True),
        _figure("untuned, multiple of 8: worst speed over tuned", tuned, "worst", 0.90, True),
        _figure(f"untuned, odd from {ODD_FROM}: worst % of copy", shares(odd, UNTUNED),
                "worst", 80.0, True),
        _figure(f"untuned, odd from {ODD_FROM}: worst speed over the best peer",
                ratios(odd, UNTUNED), "worst", 1.0, True),
        _figure("no shipped DB: geo-mean speed over the best peer", ratios(bulk, "no-shipped"),
                "geo", 1.0, True),
        _figure("rows 1-256, untuned: worst speed over the best peer (CUDA graph)",
                ratios(small, UNTUNED), "worst", 1.0, True),
        _figure("rows 1-256, no shipped DB: worst speed over the best peer (CUDA graph)",
                ratios(small, "no-shipped"), "worst", 1.0, True),
        _figure(f"fp32 rows of mean {OFFSET_MEAN:g}, spread {OFFSET_SPREAD:g}: worst error",
                fp32, "worst", OFFSET_TOL, False),
    ]
