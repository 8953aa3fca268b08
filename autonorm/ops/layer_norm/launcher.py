"""The host launcher of an exported row-norm kernel: the ``.cu`` and ``.h`` that export writes.

It serves every problem that runs LayerNorm's kernels (LayerNorm, RMSNorm and RMSNorm after a
residual add). The ``.cu`` holds the rendered kernel source verbatim, then a host launcher
``cudaError_t <basename>_forward(x, [weight,] [bias,] y, rows, eps, stream)``, or with the
residual add ``<basename>_forward(x, residual, [weight,] y, h, rows, eps, stream)``, with the
launch plan baked in (threads, dynamic shared memory, the grid rule of
:meth:`autonorm.codegen.kernel.LaunchPlan.grid`). For a resident plan (the bulk-copy kernel)
the launcher asks the CUDA occupancy API, once per device, how many clusters fit at once, as
the runtime does in process. It needs only the CUDA runtime: no Python, CuPy or autonorm at run
time. The weight and bias parameters exist only when the problem has them, so a call cannot
pass a tensor that the kernel would silently ignore. The header says what the kernel computes:
LayerNorm's formula, or RMSNorm's with Gemma's ``1 + weight`` and the residual add where the
problem has them.

The family's export hooks (:mod:`autonorm.ops.layer_norm.family`) call these functions; the
generic part of an export (the kernel, the manifest, writing files) is :mod:`autonorm.export`'s.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from autonorm.codegen.kernel import DYNAMIC_MIN_TILES, LaunchPlan, RenderedKernel
from autonorm.codegen.launcher_context import shared_context
from autonorm.codegen.spellings import CTYPES
from autonorm.dtypes import SHORT_DTYPES
from autonorm.ops.layer_norm.codegen import code_version, template_environment
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.problem import Problem, RowProblem
from autonorm.runtime import workspace

HEADER_TEMPLATE = "export_launcher.h.j2"
SOURCE_TEMPLATE = "export_launcher.cu.j2"

# Above 48 KiB of dynamic shared memory a kernel must opt in (cudaFuncSetAttribute).
_SMEM_DEFAULT_LIMIT = 48 * 1024


def default_basename(problem: Problem) -> str:
    """Return the default file stem, e.g. ``autonorm_ln_bf16_h16384``.

    A problem without weight or bias gets ``_noweight`` / ``_nobias`` appended, so the variants
    of one hidden size can live in one directory and link into one program.
    """
    prefix = "autonorm_add_ln" if problem.residual else "autonorm_ln"
    name = f"{prefix}_{SHORT_DTYPES[problem.dtype]}_h{problem.hidden}"
    if not problem.has_weight:
        name += "_noweight"
    if not problem.has_bias:
        name += "_nobias"
    if problem.wide_residual:
        name += "_f32res"
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
    """Return the manifest entries that describe the launcher: its functions, files and plan.

    An RMSNorm export, or one with the residual add, lists its launchers' parameters too
    (``parameters`` and ``parameters_with_workspace``, name and C type each, in order), from the
    list the templates declare them by: they are not plain LayerNorm's. A plain LayerNorm
    manifest keeps the entries it has always had, so those exports stay byte for byte what they
    were.
    """
    plan = kernel.launch
    # Thread-block clusters and the bulk-copy engine (cp.async.bulk, mbarrier transactions)
    # exist from compute capability 9.0 on.
    min_cc = 90 if plan.cluster > 1 or plan.resident else None
    parameters: dict[str, Any] = {}
    if kernel.problem.norm != "layer" or kernel.problem.residual:
        listed = launcher_parameters(kernel.problem)
        parameters = {
            "parameters": [{"name": n, "type": t} for t, n in listed],
            "parameters_with_workspace": [
                {"name": n, "type": t}
                for t, n in (*listed[:-1], ("unsigned int*", "workspace"), listed[-1])],
        }
    return {
        "function": f"{basename}_forward",
        "function_with_workspace": f"{basename}_forward_ws",
        **parameters,
        "workspace_bytes": _workspace_bytes(kernel.config),
        "files": {"source": f"{basename}.cu", "header": f"{basename}.h"},
        "launch": {
            **dataclasses.asdict(plan),
            "grid_rule": describe_grid(kernel.config, plan),
            "min_compute_capability": min_cc,
        },
    }


def _pointers(problem: RowProblem) -> tuple[list[str], list[str]]:
    """The launcher's pointer parameters after x: the inputs (read), then the outputs."""
    residual = problem.residual
    inputs = ["residual"] * residual + ["weight"] * problem.has_weight + ["bias"] * problem.has_bias
    return inputs, ["y"] + ["h"] * residual


def launcher_parameters(problem: RowProblem) -> list[tuple[str, str]]:
    """Return ``<basename>_forward``'s parameters as (C type, name) pairs, in order.

    ``<basename>_forward_ws`` takes ``unsigned int* workspace`` before ``stream``.
    """
    ctype = CTYPES[problem.dtype]
    inputs, outputs = _pointers(problem)
    types = _pointer_types(problem)
    return [(f"const {ctype}*", "x"), *((f"const {types[n]}*", n) for n in inputs),
            *((f"{types[n]}*", n) for n in outputs), ("int", "rows"), ("float", "eps"),
            ("cudaStream_t", "stream")]


def _pointer_types(problem: RowProblem) -> dict[str, str]:
    """The C element type of each pointer parameter: the residual's and h's are h's dtype."""
    inputs, outputs = _pointers(problem)
    ctype, htype = CTYPES[problem.dtype], CTYPES[problem.h_dtype]
    return {n: htype if n in ("residual", "h") else ctype for n in ["x", *inputs, *outputs]}


def _h_stored(problem: RowProblem) -> str:
    """How the header says h is stored: rounded to the dtype, or kept as a float32 sum."""
    if problem.wide_residual:
        return "in float32 (residual and h are float32) and stored"
    return f"rounded to {problem.dtype} and stored"


def _kernel_args(problem: RowProblem) -> list[str]:
    """The kernel's arguments before its workspace, in the order of the family's launch ABI.

    x, (residual,) weight, bias, y, (h,) rows, eps: an absent weight or bias is a null pointer.
    """
    residual = problem.residual
    return (["x"] + ["residual"] * residual
            + ["weight" if problem.has_weight else "nullptr",
               "bias" if problem.has_bias else "nullptr", "y"]
            + ["h"] * residual + ["rows", "eps"])


def _title(problem: RowProblem) -> str:
    """What the export computes, in words (the first line of each file)."""
    norm = "LayerNorm forward" if problem.norm == "layer" else "RMSNorm forward"
    return f"residual add + {norm}" if problem.residual else norm


def _scale(problem: RowProblem) -> str:
    """The factor RMSNorm's formula ends with in the header: `` * weight`` and its forms."""
    if not problem.has_weight:
        return ""
    return " * (1 + weight)" if problem.weight_offset else " * weight"


def _workspace_bytes(config: KernelConfig) -> int:
    """The bulk-copy kernel's tile counter (autonorm.runtime.workspace); others take none."""
    return workspace.COUNTER_BYTES if config.cache == "bulk" else 0


def _context(kernel: RenderedKernel, basename: str) -> dict[str, Any]:
    config, problem, plan = kernel.config, kernel.problem, kernel.launch
    inputs, outputs = _pointers(problem)
    return {
        **shared_context(kernel, basename, code_version()),
        "title": _title(problem),
        "scale": _scale(problem),
        "inputs": inputs,
        "outputs": outputs,
        "tensors": ["x", *inputs, *outputs],
        "kernel_args": _kernel_args(problem),
        "ptypes": _pointer_types(problem),
        "h_stored": _h_stored(problem),
        "rows_per_block": plan.rows_per_block,
        "blocks_per_sm": plan.blocks_per_sm,
        "resident": plan.resident,
        "workspace_bytes": _workspace_bytes(config),
        "dynamic_min_tiles": DYNAMIC_MIN_TILES,
        "grid_rule": describe_grid(config, plan),
        "smem_default_limit": _SMEM_DEFAULT_LIMIT,
    }
