"""The host launcher of an exported backward kernel: the ``.cu`` and ``.h`` that export writes.

The ``.cu`` holds the rendered kernel verbatim, then two functions that need only the CUDA
runtime (no Python, CuPy or autonorm at run time):

- ``<basename>_workspace_bytes(rows, &bytes)``: the device memory a launch of ``rows`` rows
  needs on the current device (the grid barrier's counter, then the fp32 partials);
- ``<basename>_backward(dy, x, [weight,] [dh,] dx, [dweight,] [dbias,] rows, eps, workspace,
  workspace_bytes, stream)``: dx, and the column sums dweight and dbias.

The launcher sizes the grid as the runtime does in process
(:meth:`autonorm.codegen.kernel.LaunchPlan.grid`): the kernel's blocks meet at a grid barrier,
so it never launches more than the occupancy API says can be resident on the SMs the context may
use (fewer for an MPS client or in a green context, asked of ``cuCtxGetExecAffinity`` and
``cuCtxGetDevResource`` through the runtime's driver entry point, so nothing links
``libcuda``). The pointer parameters exist only where the problem has them. The family's export
hooks (:mod:`.family`) call these functions; the generic part of an export is
:mod:`autonorm.export`'s.
"""

from __future__ import annotations

from typing import Any

from autonorm.codegen.environment import environment
from autonorm.codegen.kernel import RenderedKernel
from autonorm.codegen.launcher_context import shared_context
from autonorm.codegen.spellings import CTYPES
from autonorm.dtypes import SHORT_DTYPES
from autonorm.ops.norm_backward.codegen import TEMPLATE_DIR, code_version
from autonorm.ops.norm_backward.contract import grid_rule, grid_terms
from autonorm.ops.norm_backward.problem import BackwardProblem

HEADER_TEMPLATE = "export_backward.h.j2"
SOURCE_TEMPLATE = "export_backward.cu.j2"

# The workspace: the grid barrier's counter (two unsigned ints) first, then the partials from
# this offset, so they keep the alignment of the allocation (the kernel reads them as float4).
COUNTER_BYTES = 8
PARTIALS_OFFSET = 256


def default_basename(problem: BackwardProblem) -> str:
    """Return the default file stem, e.g. ``autonorm_ln_bwd_bf16_h16384``.

    As the forwards' exports: ``add_`` after ``autonorm_`` for the backward of a residual add,
    ``_noweight`` / ``_nobias`` where the problem lacks them and ``_offset`` for Gemma's weight,
    so the variants of one hidden size can live in one directory and link into one program.
    """
    norm = "ln" if problem.norm == "layer" else "rms"
    add = "add_" if problem.residual else ""
    name = f"autonorm_{add}{norm}_bwd_{SHORT_DTYPES[problem.dtype]}_h{problem.hidden}"
    if not problem.has_weight:
        name += "_noweight"
    elif problem.weight_offset:
        name += "_offset"
    if problem.norm == "layer" and not problem.has_bias:
        name += "_nobias"
    return name


def launcher_parameters(problem: BackwardProblem) -> list[tuple[str, str]]:
    """Return ``<basename>_backward``'s parameters as (C type, name) pairs, in order.

    As autonorm's ``layer_norm_backward(dy, x, weight, bias, dh=...)``: the gradient first, then
    the forward's input, its weight and the returned h's gradient, then the outputs.
    """
    ctype = CTYPES[problem.dtype]
    inputs, outputs = _pointers(problem)
    return [*((f"const {ctype}*", n) for n in inputs), *((f"{ctype}*", n) for n in outputs),
            ("int", "rows"), ("float", "eps"), ("void*", "workspace"),
            ("size_t", "workspace_bytes"), ("cudaStream_t", "stream")]


def launcher_files(kernel: RenderedKernel, basename: str) -> dict[str, str]:
    """Return ``<basename>.cu`` (the kernel, then its launcher) and ``<basename>.h``, by name."""
    context = _context(kernel, basename)
    env = environment(TEMPLATE_DIR)
    return {
        f"{basename}.cu": env.get_template(SOURCE_TEMPLATE).render(**context),
        f"{basename}.h": env.get_template(HEADER_TEMPLATE).render(**context),
    }


def manifest_entries(basename: str, problem: BackwardProblem) -> dict[str, Any]:
    """Return the manifest entries that name the launcher: its functions, parameters and files."""
    return {
        "function": f"{basename}_backward",
        "parameters": [{"name": n, "type": t} for t, n in launcher_parameters(problem)],
        "function_workspace_bytes": f"{basename}_workspace_bytes",
        "files": {"source": f"{basename}.cu", "header": f"{basename}.h"},
    }


def _pointers(problem: BackwardProblem) -> tuple[list[str], list[str]]:
    """The launcher's pointer parameters: the inputs (read), then the outputs."""
    inputs = ["dy", "x"] + ["weight"] * problem.has_weight + ["dh"] * problem.residual
    outputs = ["dx"] + ["dweight"] * problem.has_weight + ["dbias"] * problem.has_bias
    return inputs, outputs


def _kernel_args(problem: BackwardProblem) -> list[str]:
    """The kernel's arguments before its counter, in its parameter order (``KERNEL_ABI``).

    x, dy, weight, dx, dweight, dbias, partials, dh, rows, eps: an absent one is a null pointer.
    """
    def present(name: str, on: bool) -> str:
        return name if on else "nullptr"

    return ["x", "dy", present("weight", problem.has_weight), "dx",
            present("dweight", problem.has_weight), present("dbias", problem.has_bias),
            "partials", present("dh", problem.residual), "rows", "eps"]


def _title(problem: BackwardProblem) -> str:
    """What the export computes, in words (the first line of each file)."""
    norm = "LayerNorm backward" if problem.norm == "layer" else "RMSNorm backward"
    return f"residual add + {norm}" if problem.residual else norm


def _context(kernel: RenderedKernel, basename: str) -> dict[str, Any]:
    problem, plan = kernel.problem, kernel.launch
    inputs, outputs = _pointers(problem)
    return {
        **shared_context(kernel, basename, code_version()),
        "title": _title(problem),
        "inputs": inputs,
        "outputs": outputs,
        "parameters": launcher_parameters(problem),
        "kernel_args": _kernel_args(problem),
        "sums": problem.sums,
        "barrier": plan.barrier,
        **grid_terms(plan),
        "grid_rule": grid_rule(plan),
        "counter_bytes": COUNTER_BYTES,
        "partials_offset": PARTIALS_OFFSET,
        "min_cc": 90 if kernel.config.cache == "bulk" else 75,
        "large_cluster": plan.large_cluster,
    }
