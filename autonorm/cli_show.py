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


def print_table(found: Sequence[tuple[str, Winner]], title: str) -> None:
    """Print (source, winner) pairs as a table on stdout, one winner a line."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"autonorm tuned kernels ({title})", box=box.SIMPLE_HEAD)
    for col in ("source", "GPU", "op", "dtype", "hidden", "with", "rows<=", "config", "us",
                "GB/s", "% copy"):
        # The config label is what a user copies into `render` or `export`: never cut it.
        table.add_column(col, justify="right" if col in _NUMERIC else "left", no_wrap=True,
                         min_width=len(col) if col != "config" else 32)
    for source, w in found:
        m, fields = w.metrics, w.key.fields
        table.add_row(
            source, w.key.device.split("|")[0].removeprefix("NVIDIA "), w.key.op,
            SHORT_DTYPES.get(w.key.dtype, w.key.dtype), str(w.key.hidden), other_fields(fields),
            str(w.key.rows_bucket), config_label(w.key.op, w.config),
            f"{m.get('median_us', 0):.1f}", f"{m.get('gbps', 0):.0f}",
            f"{m.get('share', 0) * 100:.1f}",
        )
    console = Console()
    if not console.is_terminal:
        # Piped or redirected: whole rows rather than a table folded to 80 columns.
        console = Console(width=max(console.width, 150))
    console.print(table)


def describe_export(manifest: dict[str, Any]) -> str:
    """Say what an export holds and which GPUs its source needs, from its manifest (two lines)."""
    from autonorm.export.arch import arch_name, describe_cc

    extra = (f"; {manifest['function_with_workspace']}() takes a workspace of "
             f"{manifest['workspace_bytes']} bytes for the dynamic tile schedule (see the header)"
             if manifest.get("workspace_bytes") else "")
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
