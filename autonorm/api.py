"""The public norm functions, :func:`layer_norm` and :func:`rms_norm`, for CuPy, torch and NumPy.

CuPy arrays run the tuned kernel that :mod:`autonorm.dispatch` hands out; torch tensors go to
:mod:`autonorm.torch` (imported only then); NumPy arrays are computed on the CPU in float64, so
the functions work on any machine.
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
from autonorm.ops.rms_norm.problem import Problem as RMSProblem

__all__ = ["layer_norm", "rms_norm", "validate"]

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


def rms_norm(x: Any, weight: Any = None, eps: float = 1e-6, *, weight_offset: bool = False) -> Any:
    """RMSNorm over the last dimension of ``x``: ``x / sqrt(mean(x^2) + eps) * w``.

    ``w`` is ``weight``, or ``1 + weight`` with ``weight_offset`` (Gemma's form: the weight is
    stored as its offset from one, and the kernel adds the one in float32), or one without a
    weight. Accepts CuPy arrays (the tuned kernel on x's GPU, on CuPy's current stream), torch
    tensors (see :func:`autonorm.torch.rms_norm`) and NumPy arrays (computed on the CPU in
    float64 and returned in x's dtype).

    Args:
        x: input of shape (..., hidden), float32, float16 or bfloat16.
        weight: optional scale of shape (hidden,), same dtype as x.
        eps: added to the mean of squares; a finite real number > 0.
        weight_offset: scale by ``1 + weight`` instead of ``weight`` (needs a weight).

    Returns:
        An array of x's shape, dtype and kind.

    Raises:
        autonorm.errors.InputError: bad dtype, shape, device, eps or weight_offset (subclasses
            name which).

    """
    module = type(x).__module__
    if module.startswith("torch"):
        from autonorm import torch as autonorm_torch

        return autonorm_torch.rms_norm(x, weight, eps, weight_offset=weight_offset)
    check_weight_offset(weight_offset, weight)
    if isinstance(x, np.ndarray):
        from autonorm.ops.rms_norm.reference import rms_norm_cpu

        validate(x, weight, None, eps)
        if weight is not None and not isinstance(weight, np.ndarray):
            raise DeviceMismatchError("x is a NumPy array: weight must be too")
        return rms_norm_cpu(x, weight, float(eps), bool(weight_offset))
    if not module.startswith("cupy"):
        raise InputError(
            f"x must be a CuPy array, a torch tensor or a NumPy array, got {type(x).__name__}"
        )
    dtype, rows, hidden = validate(x, weight, None, eps)
    problem = RMSProblem(hidden, dtype, weight is not None, bool(weight_offset))
    return _launch_cupy(problem, rows, x, weight, None, float(eps))


def validate(x: Any, weight: Any, bias: Any, eps: Any) -> tuple[str, int, int]:
    """Check the arguments of :func:`layer_norm` or :func:`rms_norm`; return (dtype, rows, hidden).

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
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None:
            check_like_x(x, name, t, (hidden,), "x's hidden size", optional=True)
    _check_eps(eps)
    if rows > 2**31 - 1:
        raise ShapeError(f"{rows} rows exceed the kernel's 32-bit row index")
    return dtype, rows, hidden


def check_like_x(
    x: Any, name: str, t: Any, shape: tuple[int, ...], what: str, *, optional: bool
) -> None:
    """Raise unless ``t`` is an array of x's kind (NumPy, CuPy) and dtype, of shape ``shape``.

    ``what`` says in errors what the shape matches (e.g. "x's hidden size"); ``optional`` adds
    "or None" to the message for a non-array.

    Raises:
        InputError: (or a subclass) naming ``name``.

    """
    kind = _kind(x)
    kind_name = _KIND_NAMES.get(kind, kind)
    if not hasattr(t, "shape") or not hasattr(t, "dtype"):
        alternative = ", or None" if optional else ""
        raise InputError(
            f"{name} must be a {kind_name} array of shape {_shape_text(shape)} like x"
            f"{alternative}; got {type(t).__name__}"
        )
    if _kind(t) != kind:
        raise DeviceMismatchError(
            f"{name} must be a {kind_name} array like x, got {type(t).__module__}."
            f"{type(t).__name__}"
        )
    if tuple(t.shape) != shape:
        raise ShapeError(
            f"{name} must have shape {_shape_text(shape)} to match {what}, got {tuple(t.shape)}"
        )
    if _dtype_name(t, name) != _dtype_name(x, "x"):
        raise UnsupportedDtypeError(f"{name} dtype {t.dtype} differs from x dtype {x.dtype}")


def _shape_text(shape: tuple[int, ...]) -> str:
    """A shape as Python writes it, e.g. ``(16,)`` or ``(2, 16)``."""
    return str(tuple(int(n) for n in shape))


def _check_eps(eps: Any) -> None:
    """Refuse an eps that is no real number (a bool, a string), or not finite and positive."""
    if isinstance(eps, (bool, np.bool_)) or not isinstance(eps, numbers.Real):
        raise InputError(f"eps must be a positive real number, got {type(eps).__name__} {eps!r}")
    value = float(eps)
    if not (math.isfinite(value) and value > 0):
        raise InputError(f"eps must be a finite positive number, got {eps!r}")


def check_weight_offset(weight_offset: Any, weight: Any) -> None:
    """Refuse a weight_offset that is no bool, or one that asks for ``1 + weight`` without one."""
    if not isinstance(weight_offset, (bool, np.bool_)):
        raise InputError(
            f"weight_offset must be True or False, got {type(weight_offset).__name__} "
            f"{weight_offset!r}"
        )
    if weight_offset and weight is None:
        raise InputError("weight_offset=True scales by 1 + weight: it needs a weight")


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
    dtype, rows, hidden = validate(x, weight, bias, eps)  # eps checked before any float()
    problem = Problem(hidden, dtype, weight is not None, bias is not None)
    return _launch_cupy(problem, rows, x, weight, bias, float(eps))


def _launch_cupy(problem: Any, rows: int, x: Any, weight: Any, bias: Any, eps: float) -> Any:
    """Run ``problem``'s dispatched kernel on validated CuPy arrays and return the new output.

    Every family here shares LayerNorm's launch ABI (x, weight, bias, y, rows, eps), with a
    null pointer for an absent weight or bias.
    """
    import cupy

    from autonorm.dispatch import get_kernel

    device_id = x.device.id
    check_same_gpu(device_id, weight=weight, bias=bias)
    with cupy.cuda.Device(device_id):
        xc = aligned_contiguous(x)
        w = None if weight is None else aligned_contiguous(weight)
        b = None if bias is None else aligned_contiguous(bias)
        y = cupy.empty(x.shape, dtype=x.dtype)
        if rows == 0:
            return y
        get_kernel(problem, rows, device_id).launch_arrays(xc, w, b, y, rows, eps)
    return y


def check_same_gpu(device_id: int, **arrays: Any) -> None:
    """Raise DeviceMismatchError naming the first array (by keyword) not a CuPy array on x's GPU.

    None stands for an absent argument and passes.
    """
    import cupy

    for name, t in arrays.items():
        if t is None:
            continue
        if not isinstance(t, cupy.ndarray):
            raise DeviceMismatchError(f"{name} must be a CuPy array on x's GPU")
        if t.device.id != device_id:
            raise DeviceMismatchError(
                f"{name} is on GPU {t.device.id} but x is on GPU {device_id}"
            )


def aligned_contiguous(a: Any) -> Any:
    """Return ``a`` C-contiguous and 16-byte aligned (copying only when needed)."""
    import cupy

    if a.flags.c_contiguous and a.data.ptr % 16 == 0:
        return a
    out = cupy.empty(a.shape, dtype=a.dtype)  # CuPy allocations are 256-byte aligned
    out[...] = a
    return out
