"""The summary printed at the end of a run: problems, copy GB/s, the h check and the tables."""

from __future__ import annotations

import math

from .constants import (
    ALL_IMPLS,
    COPY_BYTES,
    DEFAULT_OP,
    IN_PLACE_IMPLS,
    LATENCY_HIDDEN,
    MAX_PROBLEM_LINES,
)
from .copies import used_copies
from .formats import format_or_dash, mib
from .ops import OPS
from .tables import bandwidth_table, latency_table, render_table


def copy_lines(copy: dict) -> list[str]:
    """Copy GB/s per buffer size and flush (start, end, the larger used), for the summary."""
    used = copy.get("used") or used_copies(copy.get("start") or [], copy.get("end") or [])
    if not used:
        return ["copy bandwidth: not measured"]
    lines = ["copy GB/s (device-to-device, bytes moved = 2 x buffer; shares use the larger of "
             "start/end):"]
    for n in sorted({u["bytes_buffer"] for u in used}):
        cells = []
        for u in (u for u in used if u["bytes_buffer"] == n):
            start, end = (format_or_dash(u[k], ".0f") for k in ("start_gbps", "end_gbps"))
            cells.append(f"{u['flush']} flush {format_or_dash(u['gbps'], '.0f')} (start "
                         f"{start}, end {end})")
        ref = " (fixed reference)" if n == COPY_BYTES else ""
        lines.append(f"  buffer {mib(n):>8s}{ref}: " + "; ".join(cells))
    return lines


def residual_lines(records: list[dict]) -> list[str]:
    """The fused add's h check per implementation and how far the in-place form's values grew.

    Nothing for ops without a residual.
    """
    checked = [r for r in records if r.get("h_max_abs_err") is not None]
    if not checked:
        return []
    cells = []
    for impl in (i for i in ALL_IMPLS if any(r["impl"] == i for r in checked)):
        diffs = [r["h_max_abs_err"] for r in checked if r["impl"] == impl]
        worst = math.inf if any(math.isnan(d) for d in diffs) else max(diffs)  # NaN: an h with NaN
        exact = sum(d == 0 for d in diffs)
        cells.append(f"{impl} {worst:.2g} ({exact}/{len(diffs)} shapes exact)")
    lines = ["h = x + residual: largest |h - the float64 sum rounded to the dtype| over the "
             "shapes: " + "; ".join(cells)]
    grown = [r for r in records if "finite_after_timing" in r]
    if grown:
        peak = max((r["max_abs_after_timing"] for r in grown if r["finite_after_timing"]),
                   default=None)
        bad = [f"{r['dtype']} rows={r['rows']}" for r in grown if not r["finite_after_timing"]]
        lines.append("in place: inputs put back before each timed launch (sweep, llm) and each "
                     "latency measurement, which launches back to back; largest |x|, |residual| "
                     f"after one: {format_or_dash(peak, '.3g')}, "
                     + (f"NOT FINITE at {', '.join(bad)} (the timing does not depend on the "
                        "values)" if bad else "finite at every shape"))
    return lines


def print_summary(meta: dict, records: list[dict], names: list[str], plain: bool) -> None:
    bad = [r for r in records if r["status"] in ("error", "WRONG")]
    if bad:
        print("\nProblems (full text and tracebacks in peers.json):")
        for r in bad[:MAX_PROBLEM_LINES]:
            extra = f"rel_err={format_or_dash(r['rel_err'], '.2e')} tol={r['tol']:.0e}"
            if "h_rel_err" in r:
                extra += f" h_rel_err={format_or_dash(r['h_rel_err'], '.2e')}"
            msg = r["error"] if r["status"] == "error" else extra
            print(f"  {r['impl']:8s} {r['suite']} {r['dtype']} h={r['hidden']} rows={r['rows']}: "
                  f"{r['status']}: {msg}")
        if len(bad) > MAX_PROBLEM_LINES:
            print(f"  ... and {len(bad) - MAX_PROBLEM_LINES} more")
    unavailable = {r["impl"]: r["error"] for r in records if r["status"] == "unavailable"}
    for impl, why in unavailable.items():
        print(f"  {impl} unavailable: {why}")
    paths = sorted({r["path"] for r in records
                    if r["impl"] in ("autonorm", *IN_PLACE_IMPLS) and r.get("path")})
    copy = meta.get("copy", {})
    print()
    print(f"device: {meta.get('device')}  torch {meta.get('torch')}  triton {meta.get('triton')}"
          f"  liger {meta.get('liger')}")
    for line in copy_lines(copy):
        print(line)
    if paths:
        print(f"autonorm called through: {', '.join(paths)}")
    for line in residual_lines(records):
        print(line)
    print(f"wrote {meta.get('json_path')} and {meta.get('png_path') or '(no plot)'}")
    print()
    op = meta.get("op", DEFAULT_OP)
    title = OPS[op].title
    latency = "Latency" if op == DEFAULT_OP else f"{title} latency"
    h, rows = latency_table(records, names)
    sizes = sorted({r["hidden"] for r in records if r["suite"] == "latency"}) or [LATENCY_HIDDEN]
    render_table(f"{latency}, hidden {', '.join(map(str, sizes))}: do_bench (L2 flushed) / "
                 "CUDA graph / host-inclusive, us; best peer and autonorm/best per metric "
                 "(<1 = autonorm faster)", h, rows, plain)
    h, rows = bandwidth_table(records, names)
    render_table(f"{title}: GB/s and % of copy bandwidth (median of single launches, "
                 "L2 flushed by a read; copy of the same bytes); autonorm/best > 1 = autonorm "
                 "faster", h, rows, plain)
    h, rows = bandwidth_table(records, names, zero=True)
    render_table("The same launches after do_bench's zeroing flush (dirty L2 written back in "
                 "each launch): % of a copy of the same bytes under that flush; autonorm/best "
                 "by GB/s", h, rows, plain)
