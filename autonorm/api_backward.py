"""The public gradients of the norms, :func:`layer_norm_backward` and :func:`rms_norm_backward`.

CuPy arrays run the tuned backward kernel that :mod:`autonorm.dispatch` hands out (dx, and the
weight and bias gradients summed over the rows in a fixed order: the same bits on every run);
NumPy arrays are computed on the CPU in float64 and returned in x's dtype.
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
from autonorm.ops.norm_backward.problem import (
    BackwardProblem,
    LayerNormBackward,
    RMSNormBackward,
)

__all__ = ["layer_norm_backward", "rms_norm_backward"]


def layer_norm_backward(
    dy: Any, x: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5, *, dh: Any = None
) -> tuple[Any, Any, Any]:
    """The gradients of :func:`autonorm.layer_norm` at ``x`` for the output gradient ``dy``.

    Args:
        dy: gradient of the output, x's shape and dtype.
        x: the forward's input, of shape (..., hidden), float32, float16 or bfloat16; after
            :func:`autonorm.add_layer_norm`, the returned ``h = x + residual``.
        weight: the forward's weight (hidden,), or None.
        bias: the forward's bias (hidden,), or None: only whether there is one matters.
        eps: the forward's eps.
        dh: after :func:`autonorm.add_layer_norm`, the gradient of the returned h (x's shape
            and dtype), added to dx in the kernel: dx is then the gradient of both x and
            residual.

    Returns:
        ``(dx, dweight, dbias)`` in x's dtype and kind; ``dweight`` (``dbias``) is None where
        the forward had no weight (bias).

    Raises:
        autonorm.errors.InputError: bad dtype, shape, device or eps (subclasses name which).
    """
    dtype, rows, hidden = _validate(dy, x, weight, bias, eps, dh)
    problem = LayerNormBackward(hidden, dtype, weight is not None, bias is not None,
                                residual=dh is not None)
    grads = _run(problem, rows, (dy, x, dh), weight, bias, float(eps))
    return grads["dx"], grads.get("dweight"), grads.get("dbias")


def rms_norm_backward(
    dy: Any, x: Any, weight: Any = None, eps: float = 1e-6, *, weight_offset: bool = False,
    dh: Any = None,
) -> tuple[Any, Any]:
    """The gradients of :func:`autonorm.rms_norm` at ``x`` for the output gradient ``dy``.

    Args:
        dy: gradient of the output, x's shape and dtype.
        x: the forward's input, of shape (..., hidden); after :func:`autonorm.add_rms_norm`,
            the returned ``h = x + residual``.
        weight: the forward's weight (hidden,), or None.
        eps: the forward's eps.
        weight_offset: the forward scaled by ``1 + weight``.
        dh: after :func:`autonorm.add_rms_norm`, the gradient of the returned h, added to dx.

    Returns:
        ``(dx, dweight)`` in x's dtype and kind; ``dweight`` is None without a weight.

    Raises:
        autonorm.errors.InputError: bad dtype, shape, device, eps or weight_offset.
    """
    dtype, rows, hidden = _validate(dy, x, weight, None, eps, dh)
    check_weight_offset(weight_offset, weight)
    problem = RMSNormBackward(hidden, dtype, weight is not None, bool(weight_offset),
                              residual=dh is not None)
    grads = _run(problem, rows, (dy, x, dh), weight, None, float(eps))
    return grads["dx"], grads.get("dweight")


def _validate(
    dy: Any, x: Any, weight: Any, bias: Any, eps: Any, dh: Any = None
) -> tuple[str, int, int]:
    """Check x, weight, bias and eps as the forward does, and dy (and dh) against x."""
    dtype, rows, hidden = validate(x, weight, bias, eps)
    check_like_x(x, "dy", dy, tuple(x.shape), "x's shape", optional=False)
    if dh is not None:
        check_like_x(x, "dh", dh, tuple(x.shape), "x's shape", optional=True)
    module = type(x).__module__
    if not (isinstance(x, np.ndarray) or module.startswith("cupy")):
        raise InputError(f"x must be a CuPy array or a NumPy array, got {type(x).__name__}")
    return dtype, rows, hidden


def _run(
    problem: BackwardProblem, rows: int, rows_in: tuple, weight: Any, bias: Any, eps: float
) -> dict[str, Any]:
    """The gradients by name, in x's dtype and kind, of ``rows_in = (dy, x, dh)``."""
    dy, x, dh = rows_in
    if isinstance(x, np.ndarray):
        w = None if weight is None else np.asarray(weight, dtype=np.float64)
        grads = problem.gradients(x.reshape(rows, problem.hidden).astype(np.float64),
                                  dy.reshape(rows, problem.hidden).astype(np.float64), w, eps)
        if dh is not None:
            grads["dx"] = grads["dx"] + dh.reshape(rows, problem.hidden).astype(np.float64)
        return {name: g.reshape(x.shape).astype(x.dtype) if name == "dx" else g.astype(x.dtype)
                for name, g in grads.items()}
    return _run_cupy(problem, rows, rows_in, weight, bias, eps)


def _run_cupy(
    problem: BackwardProblem, rows: int, rows_in: tuple, weight: Any, bias: Any, eps: float
) -> dict[str, Any]:
    """Launch the dispatched backward kernel on validated CuPy arrays."""
    import cupy

    from autonorm.dispatch import get_kernel

    dy, x, dh = rows_in
    device_id = x.device.id
    check_same_gpu(device_id, dy=dy, weight=weight, bias=bias, dh=dh)
    n = problem.hidden
    with cupy.cuda.Device(device_id):
        dx = cupy.empty(x.shape, dtype=x.dtype)
        dw = cupy.zeros(n, dtype=x.dtype) if problem.has_weight else None
        db = cupy.zeros(n, dtype=x.dtype) if problem.has_bias else None
        grads = {"dx": dx, "dweight": dw, "dbias": db}
        if rows > 0:
            kernel = get_kernel(problem, rows, device_id)
            clusters = kernel.grid(rows) // kernel.plan.cluster
            partials = cupy.empty(problem.partial_floats(rows, clusters), dtype=cupy.float32)
            w = None if weight is None else aligned_contiguous(weight)
            dhc = None if dh is None else aligned_contiguous(dh)
            kernel.launch_arrays(aligned_contiguous(x), aligned_contiguous(dy), w, dx, dw, db,
                                 partials, dhc, rows, eps)
    return {name: g for name, g in grads.items() if g is not None}
