"""Tables: the records by shape, the best peer per metric, rendered plain or with rich."""

from __future__ import annotations

from .constants import ALL_SUITES, DTYPES, PEERS
from .formats import format_or_dash


def group_by_shape(records: list[dict]) -> list[tuple[tuple, dict[str, dict]]]:
    groups: dict[tuple, dict[str, dict]] = {}
    for r in records:
        key = (r["suite"], r["dtype"], r["hidden"], r["rows"])
        groups.setdefault(key, {})[r["impl"]] = r

    def order(key: tuple) -> tuple:
        suite, dtype, hidden, rows = key
        return (ALL_SUITES.index(suite), DTYPES.index(dtype), hidden, rows)

    return sorted(groups.items(), key=lambda kv: order(kv[0]))


def best_peer(by_impl: dict[str, dict], metric: str, higher_is_better: bool):
    """Return (impl, value) of the best correct peer for ``metric``, or (None, None)."""
    best = (None, None)
    for name in PEERS:
        r = by_impl.get(name)
        if r is None or r["status"] != "ok" or r.get(metric) is None:
            continue
        v = r[metric]
        if best[1] is None or (v > best[1] if higher_is_better else v < best[1]):
            best = (name, v)
    return best


def _bw_cell(r: dict | None, zero: bool = False) -> str:
    """GB/s and % of copy (read flush), or only the % of copy under the zeroing flush."""
    if r is None:
        return ""
    if r["status"] in ("error", "unavailable", "skipped"):
        return {"error": "error", "unavailable": "n/a", "skipped": "skipped"}[r["status"]]
    gbps, share = (r.get("gbps_zero"), r.get("share_zero")) if zero else (r["gbps"], r["share"])
    if gbps is None:
        return r["status"]
    flag = " WRONG" if r["status"] == "WRONG" else ""
    if zero:
        return (f"{share * 100:3.0f}%" if share is not None else f"{gbps:5.0f}") + flag
    pct = f" {share * 100:3.0f}%" if share is not None else ""
    return f"{gbps:5.0f}{pct}{flag}"


def _lat_cell(r: dict | None) -> str:
    if r is None:
        return ""
    if r["status"] in ("error", "unavailable", "skipped"):
        return {"error": "error", "unavailable": "n/a", "skipped": "skipped"}[r["status"]]
    ms = r.get("ms")
    vals = [
        format_or_dash(None if ms is None else ms * 1e3, ".1f"),
        format_or_dash(r.get("graph_us"), ".1f"),
        format_or_dash(r.get("host_us"), ".1f"),
    ]
    flag = " WRONG" if r["status"] == "WRONG" else ""
    return "/".join(vals) + flag


def bandwidth_table(records: list[dict], names: list[str], zero: bool = False):
    """Rows of the bandwidth suites: read flush (GB/s and %), or ``zero``: % under that flush."""
    metric = "gbps_zero" if zero else "gbps"
    headers = ["suite", "dtype", "hidden", "rows"]
    headers += [f"{n} %copy" if zero else f"{n} GB/s %copy" for n in names]
    headers += ["best peer", "autonorm/best"]
    rows = []
    for (suite, dtype, hidden, nrows), by in group_by_shape(records):
        if suite == "latency":
            continue
        peer, peer_v = best_peer(by, metric, higher_is_better=True)
        an = by.get("autonorm")
        ratio = "-"
        if an is not None and an.get(metric) and peer_v:
            ratio = f"{an[metric] / peer_v:.2f}x" + (" WRONG" if an["status"] == "WRONG" else "")
        best = (peer if zero else f"{peer} {peer_v:.0f}") if peer else "-"
        rows.append([suite, dtype, str(hidden), str(nrows)]
                    + [_bw_cell(by.get(n), zero) for n in names] + [best, ratio])
    return headers, rows


def latency_table(records: list[dict], names: list[str]):
    headers = ["dtype", "hidden", "rows"] + [f"{n} us" for n in names]
    headers += ["best peer", "autonorm/best"]
    rows = []
    for (suite, dtype, hidden, nrows), by in group_by_shape(records):
        if suite != "latency":
            continue
        an = by.get("autonorm")
        bests, ratios = [], []
        for metric in ("ms", "graph_us", "host_us"):
            peer, v = best_peer(by, metric, higher_is_better=False)
            bests.append(f"{peer}" if peer else "-")
            mine = an.get(metric) if an is not None and an["status"] in ("ok", "WRONG") else None
            ratios.append(f"{mine / v:.2f}" if (mine and v) else "-")
        rows.append([dtype, str(hidden), str(nrows)] + [_lat_cell(by.get(n)) for n in names]
                    + ["/".join(bests), "/".join(ratios)])
    return headers, rows


def render_table(title: str, headers: list[str], rows: list[list[str]], plain: bool) -> None:
    if not rows:
        return
    if not plain:
        try:
            from rich import box
            from rich.console import Console
            from rich.table import Table
        except ImportError:
            plain = True
    if not plain:
        print(title)
        table = Table(box=box.SIMPLE_HEAD)
        for i, h in enumerate(headers):
            table.add_column(h, justify="left" if i < 2 else "right", no_wrap=True)
        for row in rows:
            table.add_row(*row)
        console = Console(width=300, soft_wrap=False, no_color=True, highlight=False)
        with console.capture() as cap:
            console.print(table)
        print("\n".join(line.rstrip() for line in cap.get().splitlines()))
        return
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    print(title)
    print("  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
    print()
