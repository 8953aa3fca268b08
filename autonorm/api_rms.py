"""The fused residual add and RMSNorm, :func:`add_rms_norm`, for CuPy, torch and NumPy.

``h = x + residual`` rounded to the dtype, then ``y = rms_norm(h)``: the pre-norm sum of a
transformer block and its norm in one pass. CuPy arrays run the tuned kernel of the RMSNorm
family with the residual add; torch tensors go to :mod:`autonorm.torch`; NumPy arrays are
computed on the CPU in float64, with the same single rounding of the sum.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from autonorm.api import (
    aligned_contiguous,
    check_like_x,
    check_same_gpu,
    check_weight_offset,
    validate,
)
from autonorm.errors import InputError
from autonorm.ops.rms_norm.problem import Problem

__all__ = ["add_rms_norm"]


def add_rms_norm(
    x: Any,
    residual: Any,
    weight: Any = None,
    eps: float = 1e-6,
    *,
    weight_offset: bool = False,
    in_place: bool = False,
) -> tuple[Any, Any]:
    """Add ``residual`` to ``x`` and RMSNorm the sum: return ``(y, h)``.

    ``h = x + residual``, computed in float32 (float64 for NumPy) and rounded once to the dtype;
    ``y = h / sqrt(mean(h^2) + eps) * w`` over the last dimension, the norm of exactly the ``h``
    returned. ``w`` is ``weight``, ``1 + weight`` with ``weight_offset`` (Gemma's form), or one
    without a weight. With ``in_place``, vLLM's ``fused_add_rms_norm``: ``y`` is written into
    ``x`` and ``h`` into ``residual``, which are returned. The functional and in-place forms
    give the same bits.

    Accepts CuPy arrays (the tuned kernel on x's GPU, on CuPy's current stream), torch tensors
    (see :func:`autonorm.torch.add_rms_norm`) and NumPy arrays (computed on the CPU in float64).

    Args:
        x: input of shape (..., hidden), float32, float16 or bfloat16.
        residual: the residual stream, x's shape, dtype and kind (and GPU).
        weight: optional scale of shape (hidden,), same dtype as x.
        eps: added to the mean of squares; a finite real number > 0.
        weight_offset: scale by ``1 + weight`` instead of ``weight`` (needs a weight).
        in_place: write ``y`` into ``x`` and ``h`` into ``residual`` (which must not share
            memory) instead of new arrays.

    Returns:
        ``(y, h)``, arrays of x's shape, dtype and kind; ``(x, residual)`` with ``in_place``.

    Raises:
        autonorm.errors.InputError: bad dtype, shape, device, eps, weight_offset or in_place
            (subclasses name which).

    """
    module = type(x).__module__
    if module.startswith("torch"):
        from autonorm import torch as autonorm_torch

        return autonorm_torch.add_rms_norm(x, residual, weight, eps, weight_offset, in_place)
    if not isinstance(in_place, (bool, np.bool_)):
        raise InputError(
            f"in_place must be True or False, got {type(in_place).__name__} {in_place!r}"
        )
    check_weight_offset(weight_offset, weight)
    if isinstance(x, np.ndarray):
        return _add_rms_norm_numpy(x, residual, weight, eps, bool(weight_offset), bool(in_place))
    if not module.startswith("cupy"):
        raise InputError(
            f"x must be a CuPy array, a torch tensor or a NumPy array, got {type(x).__name__}"
        )
    dtype, rows, hidden = _validate(x, residual, weight, eps, bool(in_place))
    problem = Problem(hidden, dtype, weight is not None, bool(weight_offset), residual=True)
    return _launch_cupy(problem, rows, x, residual, weight, float(eps), bool(in_place))


def _validate(
    x: Any, residual: Any, weight: Any, eps: Any, in_place: bool
) -> tuple[str, int, int]:
    """Check the arguments (:func:`autonorm.api.validate` and the residual's); return its result.

    In place, x and residual must not share memory: each is written, with the other's result
    read from the same rows.
    """
    dtype, rows, hidden = validate(x, weight, None, eps)
    if residual is None:
        raise InputError(f"residual must be an array of x's shape {tuple(x.shape)}, got None")
    check_like_x(x, "residual", residual, tuple(x.shape), "x's shape", optional=False)
    if in_place and _kind_module(x).may_share_memory(x, residual):
        raise InputError(
            "residual shares memory with x: in_place writes both, so they must be separate"
        )
    return dtype, rows, hidden


def _kind_module(x: Any) -> Any:
    """NumPy or CuPy, whichever x belongs to."""
    if isinstance(x, np.ndarray):
        return np
    import cupy

    return cupy


def rounded_sum(x: np.ndarray, residual: np.ndarray) -> np.ndarray:
    """Return ``x + residual`` computed in float64 and rounded once to x's dtype.

    Float64 holds more than twice the bits of float32 and float16, so rounding the float64 sum
    to them gives the correctly rounded sum, the bits the kernel's float32 sum rounds to.
    """
    with np.errstate(over="ignore"):  # a sum past the dtype's range is inf, as in the kernel
        return (x.astype(np.float64) + residual.astype(np.float64)).astype(x.dtype)


def _add_rms_norm_numpy(
    x: np.ndarray, residual: Any, weight: Any, eps: Any, weight_offset: bool, in_place: bool
) -> tuple[np.ndarray, np.ndarray]:
    from autonorm.ops.rms_norm.reference import rms_norm_cpu

    _validate(x, residual, weight, eps, in_place)
    h = rounded_sum(x, residual)
    y = rms_norm_cpu(h, weight, float(eps), weight_offset)
    if not in_place:
        return y, h
    for name, a in (("x", x), ("residual", residual)):
        if not a.flags.writeable:
            raise InputError(f"{name} is read-only: in_place writes into it")
    x[...] = y
    residual[...] = h
    return x, residual


def _launch_cupy(
    problem: Problem, rows: int, x: Any, residual: Any, weight: Any, eps: float, in_place: bool
) -> tuple[Any, Any]:
    """Run the dispatched residual-add kernel on validated CuPy arrays.

    In place on contiguous, aligned arrays the kernel writes y over x and h over residual (each
    element is read before it is written, by the thread that writes it); otherwise it writes new
    arrays, copied back into x and residual where asked.
    """
    import cupy

    from autonorm.dispatch import get_kernel

    device_id = x.device.id
    check_same_gpu(device_id, residual=residual, weight=weight)
    with cupy.cuda.Device(device_id):
        w = None if weight is None else aligned_contiguous(weight)
        if in_place and all(a.flags.c_contiguous and a.data.ptr % 16 == 0 for a in (x, residual)):
            if rows:
                kernel = get_kernel(problem, rows, device_id)
                kernel.launch_arrays(x, residual, w, None, x, residual, rows, eps)
            return x, residual
        xc, rc = aligned_contiguous(x), aligned_contiguous(residual)
        y = cupy.empty(x.shape, dtype=x.dtype)
        h = cupy.empty(x.shape, dtype=x.dtype)
        if rows:
            get_kernel(problem, rows, device_id).launch_arrays(xc, rc, w, None, y, h, rows, eps)
        if not in_place:
            return y, h
        x[...] = y
        residual[...] = h
    return x, residual
