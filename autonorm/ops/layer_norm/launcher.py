"""The host launcher of an exported LayerNorm kernel: the ``.cu`` and ``.h`` that export writes.

The ``.cu`` holds the rendered kernel source verbatim, then a host launcher
``cudaError_t <basename>_forward(x, [weight,] [bias,] y, rows, eps, stream)`` with the launch
plan baked in (threads, dynamic shared memory, the grid rule of
:meth:`autonorm.codegen.kernel.LaunchPlan.grid`). For a resident plan (the bulk-copy kernel)
the launcher asks the CUDA occupancy API, once per device, how many clusters fit at once, as
the runtime does in process. It needs only the CUDA runtime: no Python, CuPy or autonorm at run
time. The weight and bias parameters exist only when the problem has them, so a call cannot
pass a tensor that the kernel would silently ignore.

The family's export hooks (:mod:`autonorm.ops.layer_norm.family`) call these functions; the
generic part of an export (the kernel, the manifest, writing files) is :mod:`autonorm.export`'s.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from autonorm.codegen.kernel import DYNAMIC_MIN_TILES, LaunchPlan, RenderedKernel
from autonorm.dtypes import SHORT_DTYPES
from autonorm.ops.layer_norm.codegen import code_version, template_environment
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.problem import Problem
from autonorm.runtime import workspace

HEADER_TEMPLATE = "export_launcher.h.j2"
SOURCE_TEMPLATE = "export_launcher.cu.j2"

_CTYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16"}
# Above 48 KiB of dynamic shared memory a kernel must opt in (cudaFuncSetAttribute).
_SMEM_DEFAULT_LIMIT = 48 * 1024


def default_basename(problem: Problem) -> str:
    """Return the default file stem, e.g. ``autonorm_ln_bf16_h16384``.

    A problem without weight or bias gets ``_noweight`` / ``_nobias`` appended, so the variants
    of one hidden size can live in one directory and link into one program.
    """
    name = f"autonorm_ln_{SHORT_DTYPES[problem.dtype]}_h{problem.hidden}"
    if not problem.has_weight:
        name += "_noweight"
    if not problem.has_bias:
        name += "_nobias"
    return name


def describe_grid(config: KernelConfig, plan: LaunchPlan | None = None) -> str:
    """Return the grid rule of ``config``'s launch plan in words (for the header and manifest).

    Args:
        config: the kernel configuration.
        plan: its launch plan (:attr:`autonorm.codegen.kernel.RenderedKernel.launch`). Only a
            resident plan (``cache="bulk"``) needs it, to name the blocks per SM assumed when
            the occupancy API cannot answer; without it they are called the launch-bounds
            minimum.

    """
    tile = "row" if config.rows_per_block == 1 else f"{config.rows_per_block} rows"
    unit = "block" if config.cluster == 1 else f"cluster of {config.cluster} blocks"
    units = "clusters" if config.cluster > 1 else "blocks"
    if config.cache == "bulk":
        # The bulk-copy kernel is persistent whatever config.blocks_per_sm says (0); its grid
        # is sized by occupancy, so the rule names the query and its fallback.
        per_sm = "SMs * " + (str(plan.blocks_per_sm) if plan else "the launch-bounds minimum")
        if config.cluster > 1:
            per_sm += f" / {config.cluster}"
        return (
            f"one {unit} per {tile}, but at most as many {units} as the CUDA occupancy API says "
            f"can be resident at once (max(1, {per_sm}) if it cannot tell), which stride over "
            "the rows (persistent)"
        )
    if not config.blocks_per_sm:
        return f"one {unit} per {tile}"
    per_sm = f"SMs * {config.blocks_per_sm}"
    if config.cluster > 1:
        per_sm += f" / {config.cluster}"
    return (
        f"one {unit} per {tile}, but at most max(1, {per_sm}) {units}, which stride over the "
        "rows (persistent)"
    )


def launcher_files(kernel: RenderedKernel, basename: str) -> dict[str, str]:
    """Return ``<basename>.cu`` (the kernel, then its launcher) and ``<basename>.h``, by name."""
    context = _context(kernel, basename)
    env = template_environment()
    return {
        f"{basename}.cu": env.get_template(SOURCE_TEMPLATE).render(**context),
        f"{basename}.h": env.get_template(HEADER_TEMPLATE).render(**context),
    }


def manifest_entries(kernel: RenderedKernel, basename: str) -> dict[str, Any]:
    """Return the manifest entries that describe the launcher: its functions, files and plan."""
    plan = kernel.launch
    # Thread-block clusters and the bulk-copy engine (cp.async.bulk, mbarrier transactions)
    # exist from compute capability 9.0 on.
    min_cc = 90 if plan.cluster > 1 or plan.resident else None
    return {
        "function": f"{basename}_forward",
        "function_with_workspace": f"{basename}_forward_ws",
        "workspace_bytes": _workspace_bytes(kernel.config),
        "files": {"source": f"{basename}.cu", "header": f"{basename}.h"},
        "launch": {
            **dataclasses.asdict(plan),
            "grid_rule": describe_grid(kernel.config, plan),
            "min_compute_capability": min_cc,
        },
    }


def _workspace_bytes(config: KernelConfig) -> int:
    """The bulk-copy kernel's tile counter (autonorm.runtime.workspace); others take none."""
    return workspace.COUNTER_BYTES if config.cache == "bulk" else 0


def _context(kernel: RenderedKernel, basename: str) -> dict[str, Any]:
    config, problem, plan = kernel.config, kernel.problem, kernel.launch
    return {
        "basename": basename,
        "guard": f"{basename.upper()}_H_",
        "macro": basename.upper(),
        "version": code_version(),
        "label": config.label(),
        "kernel": kernel.name,
        "kernel_source": kernel.source,
        "dtype": problem.dtype,
        "ctype": _CTYPES[problem.dtype],
        "hidden": problem.hidden,
        "has_weight": problem.has_weight,
        "has_bias": problem.has_bias,
        "threads": plan.threads,
        "smem_bytes": plan.smem_bytes,
        "rows_per_block": plan.rows_per_block,
        "cluster": plan.cluster,
        "blocks_per_sm": plan.blocks_per_sm,
        "resident": plan.resident,
        "workspace_bytes": _workspace_bytes(config),
        "dynamic_min_tiles": DYNAMIC_MIN_TILES,
        "grid_rule": describe_grid(config, plan),
        "smem_default_limit": _SMEM_DEFAULT_LIMIT,
    }
