"""The template keys every exported host launcher shares, forward and backward.

Each family's launcher adds its own (pointers, grid rule, workspace) to these.

Pure logic: no CuPy, no GPU.
"""

from __future__ import annotations

from typing import Any

from autonorm.codegen.kernel import RenderedKernel
from autonorm.codegen.spellings import CTYPES, element_names


def shared_context(kernel: RenderedKernel, basename: str, version: str) -> dict[str, Any]:
    """Return the launcher-template keys that do not depend on ``kernel``'s family.

    Args:
        kernel: the rendered kernel the launcher launches.
        basename: the export's file and function prefix.
        version: the autonorm code version of the family that rendered the kernel.

    Returns:
        The export's names (``basename``, include ``guard``, ``macro`` prefix, the element
        typedef's ``elem`` and ``c_ctype``), the kernel's identity (``kernel``,
        ``kernel_source``, ``label``, ``version``), and the problem's and launch plan's numbers
        both launchers read.
    """
    problem, plan = kernel.problem, kernel.launch
    return {
        "basename": basename,
        "guard": f"{basename.upper()}_H_",
        "macro": basename.upper(),
        "version": version,
        "label": kernel.config.label(),
        "kernel": kernel.name,
        "kernel_source": kernel.source,
        "dtype": problem.dtype,
        "ctype": CTYPES[problem.dtype],
        **element_names(problem.dtype, basename),
        "rms": problem.norm == "rms",
        "weight_offset": problem.weight_offset,
        "residual": problem.residual,
        "hidden": problem.hidden,
        "has_weight": problem.has_weight,
        "has_bias": problem.has_bias,
        "threads": plan.threads,
        "smem_bytes": plan.smem_bytes,
        "cluster": plan.cluster,
    }
