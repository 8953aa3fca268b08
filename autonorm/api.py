"""The public LayerNorm function, :func:`layer_norm`, for CuPy arrays, torch tensors and NumPy.

CuPy arrays run the tuned kernel that :mod:`autonorm.dispatch` hands out; torch tensors go to
:mod:`autonorm.torch` (imported only then); NumPy arrays are computed on the CPU in float64, so
the function works on any machine.
"""

from __future__ import annotations

import math
import numbers
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

# How errors name the library of an array (the top-level module of its type).
_KIND_NAMES = {"numpy": "NumPy", "cupy": "CuPy"}


def layer_norm(x: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5) -> Any:
    """LayerNorm over the last dimension of ``x``: ``(x - mean) / sqrt(var + eps) * w + b``.

    Accepts CuPy arrays (runs the tuned kernel on x's GPU, on CuPy's current stream), torch
    tensors (see :mod:`autonorm.torch`) and NumPy arrays (computed on the CPU in float64 and
    returned in x's dtype, so the API works anywhere).

    Args:
        x: input of shape (..., hidden), float32, float16 or bfloat16.
        weight: optional scale of shape (hidden,), same dtype as x.
        bias: optional shift of shape (hidden,), same dtype as x.
        eps: added to the variance; a finite real number > 0.

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


def validate(x: Any, weight: Any, bias: Any, eps: Any) -> tuple[str, int, int]:
    """Check the arguments of :func:`layer_norm`; return (dtype, rows, hidden).

    ``weight`` and ``bias`` must be arrays of x's kind (NumPy with NumPy, CuPy with CuPy) and
    dtype, of shape (hidden,); ``eps`` a finite positive real number (not a bool or a string).

    Raises:
        InputError: (or a subclass) naming the argument at fault.

    """
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise InputError(f"x must be an array or tensor, got {type(x).__name__}")
    if len(x.shape) < 1:
        raise ShapeError("x must have at least one dimension (..., hidden); got a scalar")
    dtype = _dtype_name(x, "x")
    hidden = int(x.shape[-1])
    if hidden < 1:
        raise ShapeError(f"hidden size (last dimension) must be at least 1, got {hidden}")
    rows = int(np.prod(x.shape[:-1], dtype=np.int64)) if len(x.shape) > 1 else 1
    kind = _kind(x)
    kind_name = _KIND_NAMES.get(kind, kind)
    for name, t in (("weight", weight), ("bias", bias)):
        if t is None:
            continue
        if not hasattr(t, "shape") or not hasattr(t, "dtype"):
            raise InputError(
                f"{name} must be a {kind_name} array of shape ({hidden},) like x, or None; got "
                f"{type(t).__name__}"
            )
        if _kind(t) != kind:
            raise DeviceMismatchError(
                f"{name} must be a {kind_name} array like x, got {type(t).__module__}."
                f"{type(t).__name__}"
            )
        if tuple(t.shape) != (hidden,):
            raise ShapeError(
                f"{name} must have shape ({hidden},) to match x's hidden size, got "
                f"{tuple(t.shape)}"
            )
        if _dtype_name(t, name) != dtype:
            raise UnsupportedDtypeError(f"{name} dtype {t.dtype} differs from x dtype {x.dtype}")
    _check_eps(eps)
    if rows > 2**31 - 1:
        raise ShapeError(f"{rows} rows exceed the kernel's 32-bit row index")
    return dtype, rows, hidden


def _check_eps(eps: Any) -> None:
    """Refuse an eps that is no real number (a bool, a string), or not finite and positive."""
    if isinstance(eps, (bool, np.bool_)) or not isinstance(eps, numbers.Real):
        raise InputError(f"eps must be a positive real number, got {type(eps).__name__} {eps!r}")
    value = float(eps)
    if not (math.isfinite(value) and value > 0):
        raise InputError(f"eps must be a finite positive number, got {eps!r}")


def _kind(array: Any) -> str:
    """The library an array belongs to, by its type's top-level module ('numpy', 'cupy')."""
    return type(array).__module__.partition(".")[0]


def _dtype_name(array: Any, name: str) -> str:
    dtype = getattr(array, "dtype", None)
    try:
        return normalize_dtype(dtype)
    except ValueError:
        raise UnsupportedDtypeError(
            f"{name} has unsupported dtype {dtype}: autonorm supports float32, float16 and "
            "bfloat16"
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
