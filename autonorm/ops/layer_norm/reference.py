"""The float64 LayerNorm reference, its gradients, and the statistics the kernels merge.

:func:`layer_norm_reference` is what every kernel is verified against and
:func:`layer_norm_backward_reference` its gradients in float64; :func:`layer_norm_cpu`
runs it on NumPy arrays in their own dtype; :func:`welford` and :func:`chan_merge` are the
running and merged (count, mean, M2) statistics the kernels compute, for tests. The dtype
conversions and error measures are :mod:`autonorm.numerics`'.

Array-module agnostic: the reference takes NumPy or CuPy arrays and uses the module they came
from (``xp``), so it can run on the GPU for large verification inputs. No CuPy import at module
import.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from autonorm.numerics import array_module


def layer_norm_reference(
    x: Any, weight: Any | None, bias: Any | None, eps: float
) -> Any:
    """Float64 LayerNorm over the last axis of float64 inputs (two-pass, exact to rounding)."""
    xp = array_module(x)
    mean = x.mean(axis=-1, keepdims=True)
    centered = x - mean
    var = (centered * centered).mean(axis=-1, keepdims=True)
    y = centered / xp.sqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def layer_norm_backward_reference(
    x: Any, dy: Any, weight: Any | None, eps: float
) -> tuple[Any, Any, Any]:
    """Float64 gradients of LayerNorm over the last axis: ``(dx, dweight, dbias)``.

    With ``xhat = (x - mean) * rstd`` and ``g = dy * weight`` (``dy`` without a weight),
    ``dx = rstd * (g - mean(g) - xhat * mean(g * xhat))`` per row; ``dweight`` sums
    ``dy * xhat`` and ``dbias`` sums ``dy`` over every row (all leading axes). The statistics
    are two-pass, as in :func:`layer_norm_reference`.
    """
    xp = array_module(x)
    mean = x.mean(axis=-1, keepdims=True)
    centered = x - mean
    rstd = 1.0 / xp.sqrt((centered * centered).mean(axis=-1, keepdims=True) + eps)
    xhat = centered * rstd
    g = dy if weight is None else dy * weight
    dx = rstd * (g - g.mean(axis=-1, keepdims=True)
                 - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    rows = tuple(range(x.ndim - 1))
    return dx, (dy * xhat).sum(axis=rows), dy.sum(axis=rows)


def chan_merge(
    a: tuple[float, float, float], b: tuple[float, float, float]
) -> tuple[float, float, float]:
    """Merge two (count, mean, M2) partials (Chan et al.), as the kernels do across threads.

    >>> chan_merge((2, 11.0, 2.0), (2, 15.0, 2.0))
    (4, 13.0, 20.0)
    """
    na, ma, m2a = a
    nb, mb, m2b = b
    n = na + nb
    if nb == 0:
        return a
    if na == 0:
        return b
    delta = mb - ma
    mean = ma + delta * nb / n
    m2 = m2a + m2b + delta * delta * na * nb / n
    return (n, mean, m2)


def welford(values: Any) -> tuple[float, float, float]:
    """Return (count, mean, M2) of ``values`` by Welford's update, in float64."""
    n, mean, m2 = 0, 0.0, 0.0
    for v in np.asarray(values, dtype=np.float64).ravel():
        n += 1
        delta = v - mean
        mean += delta / n
        m2 += delta * (v - mean)
    return (n, mean, m2)


def layer_norm_cpu(x: np.ndarray, weight: Any | None, bias: Any | None, eps: float) -> Any:
    """LayerNorm of NumPy arrays on the CPU, returned in the input dtype (float64 inside)."""
    y = layer_norm_reference(
        x.astype(np.float64),
        None if weight is None else np.asarray(weight, dtype=np.float64),
        None if bias is None else np.asarray(bias, dtype=np.float64),
        eps,
    )
    return y.astype(x.dtype)
