"""The GPU scripts' one-line refusal on a machine that cannot run them.

Each script of ``benchmarks/`` that times kernels calls :func:`require_gpu` right after parsing
its arguments (``--help``, ``--plan`` and the like still work anywhere): without CuPy, a GPU,
or the PyTorch and Triton its peers need, it exits with one line that names the script and
what is missing, not with a traceback from deep inside the first import that failed.
"""

from __future__ import annotations

import importlib.util
import sys


def missing(torch: bool = False, triton: bool = False) -> str | None:
    """Return what this machine lacks to time kernels, or None where it has everything.

    Args:
        torch: the script also needs PyTorch with CUDA.
        triton: the script also needs Triton (its timing helpers or a peer).

    """
    from autonorm.runtime.device import NoGPUError, import_cupy

    try:
        import_cupy()
    except NoGPUError as error:
        return str(error)
    if torch:
        try:
            import torch as torch_module
        except ImportError:
            return "PyTorch is not installed (pip install torch, a CUDA build)"
        if not torch_module.cuda.is_available():
            return f"PyTorch {torch_module.__version__} sees no CUDA GPU (a CPU build?)"
    if triton and importlib.util.find_spec("triton") is None:
        return "Triton is not installed (it comes with PyTorch's CUDA builds; pip install triton)"
    return None


def require_gpu(script: str, torch: bool = False, triton: bool = False) -> None:
    """Exit with status 2 and one line on stderr where :func:`missing` finds something missing.

    Args:
        script: the script's file name, e.g. ``explore.py``.
        torch: the script also needs PyTorch with CUDA.
        triton: the script also needs Triton.

    """
    reason = missing(torch=torch, triton=triton)
    if reason is not None:
        print(f"{script} needs a CUDA GPU: {reason}", file=sys.stderr)
        sys.exit(2)
