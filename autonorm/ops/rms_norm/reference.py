"""The float64 RMSNorm reference, its gradients, and RMSNorm of NumPy arrays on the CPU.

:func:`rms_norm_reference` is what every RMSNorm kernel is verified against and
:func:`rms_norm_backward_reference` its gradients in float64. Array-module
agnostic (NumPy or CuPy, by the input); no CuPy import at module import.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from autonorm.numerics import array_module


def rms_norm_reference(
    x: Any, weight: Any | None, eps: float, weight_offset: bool = False
) -> Any:
    """Float64 RMSNorm over the last axis: ``x / sqrt(mean(x^2) + eps) * w``.

    ``w`` is ``weight``, ``1 + weight`` with ``weight_offset``, or one when ``weight`` is None.
    """
    xp = array_module(x)
    y = x / xp.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
    if weight is not None:
        y = y * (1.0 + weight if weight_offset else weight)
    return y


def rms_norm_backward_reference(
    x: Any, dy: Any, weight: Any | None, eps: float, weight_offset: bool = False
) -> tuple[Any, Any]:
    """Float64 gradients of RMSNorm over the last axis: ``(dx, dweight)``.

    With ``xhat = x * rstd`` and ``g = dy * w`` (``w`` as in :func:`rms_norm_reference`),
    ``dx = rstd * (g - xhat * mean(g * xhat))`` per row; ``dweight`` sums ``dy * xhat`` over
    every row (the offset form's too: ``d(1 + weight) / d weight`` is one), None without a
    weight.
    """
    xp = array_module(x)
    rstd = 1.0 / xp.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
    xhat = x * rstd
    g = dy
    if weight is not None:
        g = dy * (1.0 + weight if weight_offset else weight)
    dx = rstd * (g - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    rows = tuple(range(x.ndim - 1))
    return dx, None if weight is None else (dy * xhat).sum(axis=rows)


def rms_norm_cpu(
    x: np.ndarray, weight: Any | None, eps: float, weight_offset: bool = False
) -> Any:
    """RMSNorm of NumPy arrays on the CPU, returned in the input dtype (float64 inside)."""
    y = rms_norm_reference(
        x.astype(np.float64),
        None if weight is None else np.asarray(weight, dtype=np.float64),
        eps,
        weight_offset,
    )
    return y.astype(x.dtype)
