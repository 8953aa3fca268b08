"""untuned.py's tables (no GPU): a markdown table per dtype and kind, and the summary's."""

from __future__ import annotations

from .untuned_constants import UNTUNED
from .untuned_records import autonorm_key


def format_table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def number_or_dash(v: float | None, spec: str, suffix: str = "") -> str:
    return "-" if v is None else format(v, spec) + suffix


def _cell(r: dict | None, bulk: bool) -> str:
    """autonorm's or a peer's figure: % of copy (bulk) or microseconds (small), or its status."""
    if r is None:
        return ""
    if r["status"] in ("error", "unavailable", "skipped"):
        return {"error": "error", "unavailable": "n/a", "skipped": "skipped"}[r["status"]]
    value = r["share"] * 100 if bulk and r["share"] else (None if bulk else r["us"])
    text = number_or_dash(value, ".1f")
    return text + (" WRONG" if r["status"] == "WRONG" else "")


def format_dtype_tables(records: list[dict], dtype: str, modes: list[str]) -> list[str]:
    """The bulk table (% of copy) and the small-rows table (us) of one dtype, in markdown."""
    out = []
    for kind, title in (("bulk", f"{dtype}, rows = 2^26 / hidden: % of copy bandwidth"),
                        ("small", f"{dtype}, rows 1-256: microseconds by CUDA-graph replay")):
        recs = [r for r in records if r["dtype"] == dtype and r["kind"] == kind]
        if not recs:
            continue
        bulk = kind == "bulk"
        shown = [m for m in modes if bulk or m != "tuned"]
        unit = "%" if bulk else "us"
        headers = ["hidden", "rows", "odd"] + [f"{m} {unit}" for m in shown]
        headers += ["best peer", f"peer {unit}"] + [f"{m} / peer" for m in shown]
        if bulk and "tuned" in modes and UNTUNED in modes:
            headers.append("untuned / tuned")
        if dtype == "fp32":
            headers.append("offset err")
        rows = []
        for r in sorted(recs, key=lambda r: (r["rows"] if not bulk else 0, r["hidden"])):
            if r["status"] == "skipped":
                rows.append([str(r["hidden"]), str(r["rows"]), "yes" if r["odd"] else "",
                             "skipped"] + [""] * (len(headers) - 4))
                continue
            peer = r["best_peer"]
            peer_v = (r["best_peer_share"] * 100 if r["best_peer_share"] else None) if bulk \
                else r["best_peer_us"]
            row = [str(r["hidden"]), str(r["rows"]), "yes" if r["odd"] else ""]
            row += [_cell(r["impls"].get(autonorm_key(m)), bulk) for m in shown]
            row += [peer or "-", number_or_dash(peer_v, ".1f")]
            row += [number_or_dash(r["ratio"].get(m), ".2f", "x") for m in shown]
            if bulk and "tuned" in modes and UNTUNED in modes:
                row.append(number_or_dash(r["untuned_over_tuned"], ".2f"))
            if dtype == "fp32":
                errs = [x["offset_err"] for k, x in r["impls"].items()
                        if k.startswith("autonorm:") and x.get("offset_err") is not None]
                row.append(number_or_dash(max(errs) if errs else None, ".1e"))
            rows.append(row)
        out.append(f"### {title}\n\n" + format_table(headers, rows))
    return out


def format_summary(figures: list[dict]) -> str:
    rows = []
    for f in figures:
        lower = f["better"] == "lower"
        spec = ".1e" if lower else (".1f" if "% of copy" in f["figure"] else ".3f")
        met = {None: "n/a", True: "yes", False: "NO"}[f["met"]]
        target = ("<= " if lower else ">= ") + format(f["target"], ".0e" if lower else "g")
        extra = f" ({f['missing']} missing)" if f["missing"] else ""
        rows.append([f["figure"], number_or_dash(f["value"], spec), target, f"{f['n']}{extra}",
                     f["where"] or "", met])
    return format_table(["figure", "value", "target", "shapes", "worst at", "met"], rows)


def format_report(records: list[dict], modes: list[str], dtypes: list[str],
                  figures: list[dict]) -> str:
    parts = []
    for dtype in dtypes:
        parts += format_dtype_tables(records, dtype, modes)
    parts.append("### Summary (speed over the best peer > 1: autonorm faster)\n\n"
                 + format_summary(figures))
    return "\n\n".join(parts)
