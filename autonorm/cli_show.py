"""What the command line prints about kernels.

``autonorm show``'s table (for a person) and records (for a script), and what ``autonorm
export`` says about the files it wrote.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from autonorm.dtypes import SHORT_DTYPES
from autonorm.ops import registry
from autonorm.store.keys import Winner

# Right-aligned (numeric) columns of the table.
_NUMERIC = frozenset({"hidden", "rows<=", "us", "GB/s", "% copy"})


def winner_record(source: str, winner: Winner) -> dict[str, Any]:
    """Return one winner as a JSON object: its key (problem fields at the top), config, metrics."""
    key = winner.key
    return {
        "source": source, "device": key.device, "op": key.op, **key.fields,
        "rows_bucket": key.rows_bucket, "config": winner.config, "metrics": winner.metrics,
        "kernel": winner.kernel,
    }


def config_label(op: str, config: dict[str, Any]) -> str:
    """Return the family's label of a stored configuration (its JSON if the op is unknown here)."""
    try:
        return registry.get(op).config_from_dict(config).label()
    except (KeyError, TypeError, ValueError):
        return json.dumps(config, sort_keys=True, separators=(",", ":"))


def other_fields(fields: dict[str, Any]) -> str:
    """Say a problem's fields besides dtype and hidden: ``weight, bias``, ``eps=1e-06``.

    A flag shows by its name when set (a ``has_`` prefix dropped); other fields as name=value.
    """
    parts = []
    for name in sorted(fields):
        value = fields[name]
        if name in ("dtype", "hidden") or value is False:
            continue
        parts.append(name.removeprefix("has_") if value is True else f"{name}={value}")
    return ", ".join(parts) or "-"


# Columns a terminal too narrow for the whole table loses first, in this order (the title
# then names the GPU and source where every row shares them); then the problem's other fields
# wrap. Cells are never cut: a terminal narrower still gets whole rows that it folds.
_DROPPABLE = ("GB/s", "source", "GPU")


def print_table(found: Sequence[tuple[str, Winner]], title: str) -> None:
    """Print (source, winner) pairs as a table on stdout, one winner a line."""
    columns = ("source", "GPU", "op", "dtype", "hidden", "with", "rows<=", "config", "us",
               "GB/s", "% copy")
    rows = []
    for source, w in found:
        m, fields = w.metrics, w.key.fields
        rows.append(dict(zip(columns, (
            source, w.key.device.split("|")[0].removeprefix("NVIDIA "), w.key.op,
            SHORT_DTYPES.get(w.key.dtype, w.key.dtype), str(w.key.hidden), other_fields(fields),
            str(w.key.rows_bucket), config_label(w.key.op, w.config),
            f"{m.get('median_us', 0):.1f}", f"{m.get('gbps', 0):.0f}",
            f"{m.get('share', 0) * 100:.1f}",
        ), strict=True)))
    shown = list(columns)
    table = _table(rows, shown, title)
    width = _terminal_width()
    for col in _DROPPABLE:
        if width is None or _natural_width(table) <= width:
            break
        shown.remove(col)
        table = _table(rows, shown, title)
    if width is not None and _natural_width(table) > width:
        cells = ["with", *(row["with"] for row in rows)]
        folded = max(len(word) for cell in cells for word in cell.split())
        if _natural_width(table) - max(map(len, cells)) + folded <= width:
            table = _table(rows, shown, title, wrap="with")
        else:
            width = _natural_width(table)
    print_whole(table, width)


def _table(rows: list[dict[str, str]], columns: list[str], title: str,
           wrap: str | None = None) -> Any:
    """Build the table of ``rows`` with ``columns``; the title names what the rows all share.

    Only the column named ``wrap``, if any, may fold its cells over lines.
    """
    from rich import box
    from rich.table import Table

    shared = [rows[0][col] for col in ("GPU", "source")
              if col not in columns and rows and len({row[col] for row in rows}) == 1]
    every = f"; every row {', '.join(shared)}" if shared else ""
    table = Table(title=f"autonorm tuned kernels ({title}{every})", box=box.SIMPLE_HEAD,
                  pad_edge=False)
    for col in columns:
        table.add_column(col, justify="right" if col in _NUMERIC else "left",
                         no_wrap=col != wrap)
    for row in rows:
        table.add_row(*(row[col] for col in columns))
    return table


def _terminal_width() -> int | None:
    """Return the terminal's width in columns, or None where stdout is not a terminal."""
    from rich.console import Console

    console = Console()
    return console.width if console.is_terminal else None


def _natural_width(table: Any) -> int:
    """Return the columns ``table`` needs with every cell whole."""
    from rich.console import Console

    return Console(width=1 << 16).measure(table).maximum


def print_whole(table: Any, width: int | None = None) -> None:
    """Print a rich table on stdout; piped or redirected, at its natural width, a row a line.

    Args:
        table: the rich table.
        width: columns to lay it out in on a terminal (default: the terminal's width). A pipe
            or file (for grep and scripts) gets every cell whole however wide the rows are.

    """
    from rich.console import Console

    console = Console()
    if width is None and not console.is_terminal:
        width = max(console.width, _natural_width(table))
    if width is not None:
        console = Console(width=width)
    console.print(table)


def describe_export(manifest: dict[str, Any]) -> str:
    """Say what an export holds and which GPUs its source needs, from its manifest (two lines)."""
    from autonorm.export.arch import arch_name, describe_cc

    if manifest.get("function_workspace_bytes"):  # a backward launcher's sizing function
        extra = (f"; {manifest['function_workspace_bytes']}() gives the bytes of workspace it "
                 "takes (see the header)")
    elif manifest.get("workspace_bytes"):
        extra = (f"; {manifest['function_with_workspace']}() takes a workspace of "
                 f"{manifest['workspace_bytes']} bytes for the dynamic tile schedule (see the "
                 "header)")
    else:
        extra = ""
    target = manifest["target"]
    least = target["min_compute_capability"]
    # A family without a host launcher exports its kernel alone: name the kernel then.
    function = manifest.get("function") or manifest["kernel_name"]
    return (
        f"{manifest['label']} ({manifest['source']}): {function}(){extra}\n"
        f"needs a GPU of compute capability {describe_cc(least)} ({arch_name(least)}) or newer; "
        f"made for {target['arch']} ({manifest['device_limits']['name']}): compile with "
        f"nvcc -arch={target['arch']}"
    )
