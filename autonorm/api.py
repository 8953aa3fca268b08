"""The public LayerNorm function, :func:`layer_norm`, for CuPy arrays, torch tensors and NumPy.

CuPy arrays run the tuned kernel that :mod:`autonorm.dispatch` hands out; torch tensors go to
:mod:`autonorm.torch` (imported only then); NumPy arrays are computed on the CPU in float64, so
the function works on any machine.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from autonorm.dtypes import normalize_dtype
from autonorm.errors import (
    DeviceMismatchError,
    InputError,
    ShapeError,
    UnsupportedDtypeError,
)
from autonorm.ops.layer_norm.problem import Problem

__all__ = ["layer_norm", "validate"]


def layer_norm(x: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5) -> Any:
    """LayerNorm over the last dimension of ``x``: ``(x - mean) / sqrt(var + eps) * w + b``.

    Accepts CuPy arrays (runs the tuned kernel on x's GPU, on CuPy's current stream), torch
    tensors (see :mod:`autonorm.torch`) and NumPy arrays (computed on the CPU in float64 and
    returned in x's dtype, so the API works anywhere).

    Args:
        x: input of shape (..., hidden), float32, float16 or bfloat16.
        weight: optional scale of shape (hidden,), same dtype as x.
        bias: optional shift of shape (hidden,), same dtype as x.
        eps: added to the variance; must be > 0.

    Returns:
        An array of x's shape, dtype and kind.

    Raises:
        autonorm.errors.InputError: bad dtype, shape, device or eps (subclasses name which).

    """
    module = type(x).__module__
    if module.startswith("torch"):
        from autonorm import torch as autonorm_torch

        return autonorm_torch.layer_norm(x, weight, bias, eps)
    if isinstance(x, np.ndarray):
        from autonorm.ops.layer_norm.reference import layer_norm_cpu

        validate(x, weight, bias, eps)
        for t in (weight, bias):
            if t is not None and not isinstance(t, np.ndarray):
                raise DeviceMismatchError("x is a NumPy array: weight and bias must be too")
        return layer_norm_cpu(x, weight, bias, float(eps))
    if not module.startswith("cupy"):
        raise InputError(
            f"x must be a CuPy array, a torch tensor or a NumPy array, got {type(x).__name__}"
        )
    return _layer_norm_cupy(x, weight, bias, eps)


def validate(x: Any, weight: Any, bias: Any, eps: float) -> tuple[str, int, int]:
    """Check the arguments of :func:`layer_norm`; return (dtype, rows, hidden).

    Raises:
        InputError: (or a subclass) naming the problem.

    """
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise InputError(f"x must be an array or tensor, got {type(x).__name__}")
    if len(x.shape) < 1:
        raise ShapeError("x must have at least one dimension (..., hidden); got a scalar")
    dtype = _dtype_name(x)
    hidden = int(x.shape[-1])
    if hidden < 1:
        raise ShapeError(f"hidden size (last dimension) must be at least 1, got {hidden}")
    rows = int(np.prod(x.shape[:-1], dtype=np.int64)) if len(x.shape) > 1 else 1
    for name, t in (("weight", weight), ("bias", bias)):
        if t is None:
            continue
        if tuple(t.shape) != (hidden,):
            raise ShapeError(
                f"{name} must have shape ({hidden},) to match x's hidden size, got "
                f"{tuple(t.shape)}"
            )
        if _dtype_name(t) != dtype:
            raise UnsupportedDtypeError(f"{name} dtype {t.dtype} differs from x dtype {x.dtype}")
    if not (isinstance(eps, (int, float, np.floating)) and float(eps) > 0):
        raise InputError(f"eps must be a positive number, got {eps!r}")
    if rows > 2**31 - 1:
        raise ShapeError(f"{rows} rows exceed the kernel's 32-bit row index")
    return dtype, rows, hidden


def _dtype_name(array: Any) -> str:
    dtype = getattr(array, "dtype", None)
    try:
        return normalize_dtype(dtype)
    except ValueError:
        raise UnsupportedDtypeError(
            f"unsupported dtype {dtype}: autonorm supports float32, float16 and bfloat16"
        ) from None


def _layer_norm_cupy(x: Any, weight: Any, bias: Any, eps: Any) -> Any:
    import cupy

    from autonorm.dispatch import get_kernel

    dtype, rows, hidden = validate(x, weight, bias, eps)  # eps checked before any float()
    eps = float(eps)
    device_id = x.device.id
    for name, t in (("weight", weight), ("bias", bias)):
        if t is None:
            continue
        if not isinstance(t, cupy.ndarray):
            raise DeviceMismatchError(f"{name} must be a CuPy array on x's GPU")
        if t.device.id != device_id:
            raise DeviceMismatchError(
                f"{name} is on GPU {t.device.id} but x is on GPU {device_id}"
            )
    problem = Problem(hidden, dtype, weight is not None, bias is not None)
    with cupy.cuda.Device(device_id):
        xc = _aligned_contiguous(x)
        w = None if weight is None else _aligned_contiguous(weight)
        b = None if bias is None else _aligned_contiguous(bias)
        y = cupy.empty(x.shape, dtype=x.dtype)
        if rows == 0:
            return y
        get_kernel(problem, rows, device_id).launch_arrays(xc, w, b, y, rows, eps)
    return y


def _aligned_contiguous(a: Any) -> Any:
    """Return ``a`` C-contiguous and 16-byte aligned (copying only when needed)."""
    import cupy

    if a.flags.c_contiguous and a.data.ptr % 16 == 0:
        return a
    out = cupy.empty(a.shape, dtype=a.dtype)  # CuPy allocations are 256-byte aligned
    out[...] = a
    return out
