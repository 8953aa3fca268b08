"""Output files: the JSON of every measurement and the plot of the sweep's shares."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from .constants import COLORS, DEFAULT_OP, DTYPES, IN_PLACE_IMPLS, TARGET_SHARE
from .failures import short_error
from .ops import OPS


def clean_json(obj):
    """Replace non-finite floats with None so the JSON is standard."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: clean_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean_json(v) for v in obj]
    return obj


def write_json(path: Path, meta: dict, records: list[dict], complete: bool) -> None:
    data = {"meta": dict(meta, complete=complete), "measurements": records}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(clean_json(data), indent=1, default=str))
    os.replace(tmp, path)


def write_plot(path: Path, meta: dict, records: list[dict], names: list[str]) -> str | None:
    """One panel per dtype: share of copy bandwidth vs hidden size. Returns an error or None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:  # noqa: BLE001
        return f"matplotlib unavailable: {short_error(exc)}"
    sweep = [r for r in records if r["suite"] == "sweep" and r.get("share") is not None]
    dtypes = [d for d in DTYPES if any(r["dtype"] == d for r in sweep)]
    if not dtypes:
        return "no sweep measurement with a share to plot"
    fig, axes = plt.subplots(1, len(dtypes), figsize=(6 * len(dtypes), 5.0), squeeze=False,
                             sharey=True)
    handles: dict[str, object] = {}
    top = 100.0
    for ax, dt in zip(axes[0], dtypes, strict=True):
        hiddens = sorted({r["hidden"] for r in sweep if r["dtype"] == dt})
        for name in names:
            pts = sorted((r["hidden"], r["share"] * 100, r["status"]) for r in sweep
                         if r["dtype"] == dt and r["impl"] == name)
            if not pts:
                continue
            top = max(top, *(p[1] for p in pts))
            lw = 2.6 if name in ("autonorm", *IN_PLACE_IMPLS) else 1.4
            ls = "--" if name in IN_PLACE_IMPLS else "-"
            (line,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=4, lw=lw,
                              ls=ls, color=COLORS.get(name), label=name)
            handles.setdefault(name, line)
            wrong = [p for p in pts if p[2] == "WRONG"]
            if wrong:
                mark = ax.scatter([p[0] for p in wrong], [p[1] for p in wrong], marker="x", s=90,
                                  color="black", zorder=5, label="WRONG (error over tolerance)")
                handles.setdefault("WRONG", mark)
        ref = ax.axhline(TARGET_SHARE * 100, color="gray", ls="--", lw=1, label="95% of copy")
        handles.setdefault("95%", ref)
        ax.set_xscale("log", base=2)
        ax.set_xticks(hiddens)
        ax.set_xticklabels([str(h) for h in hiddens], rotation=45, fontsize=8)
        ax.minorticks_off()
        ax.set_title(f"{dt}, rows = 2^26 / hidden")
        ax.set_xlabel("hidden size")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("% of copy of the same bytes (L2 flushed by a read, median)")
    axes[0][0].set_ylim(0, top * 1.05)
    order = [k for k in handles if k not in ("WRONG", "95%")] + [
        k for k in ("WRONG", "95%") if k in handles
    ]
    fig.legend([handles[k] for k in order], [handles[k].get_label() for k in order],
               loc="lower center", ncol=len(order), fontsize=9, frameon=False)
    used = meta.get("copy", {}).get("used") or []
    sizes = {r["copy_bytes"] for r in sweep}
    rates = [u["gbps"] for u in used
             if u["flush"] == "read" and u["bytes_buffer"] in sizes and u["gbps"]]
    lo, hi = (f"{min(rates):.0f}", f"{max(rates):.0f}") if rates else ("-", "-")
    span = lo if lo == hi else f"{lo}-{hi}"
    title = OPS[meta.get("op", DEFAULT_OP)].title
    fig.suptitle(f"{title} on {meta.get('device')}: share of a copy of the same bytes, "
                 f"L2 flushed by a read (copy {span} GB/s)")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None
