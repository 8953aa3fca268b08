"""h's dtype in the fused residual add: the rules behind ``residual_dtype``.

``h = x + residual`` is stored in x's dtype, or in float32 beside a 16-bit x (a mixed-precision
residual stream: the residual and h in float32, x, y and the weights in 16 bits). The NumPy, CuPy
and torch paths (:mod:`autonorm.api_add`, :mod:`autonorm.torch.add_route`) all resolve h's dtype
here, so they refuse the same combinations with the same words.

Pure logic: no CuPy, no torch, no GPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from autonorm.dtypes import normalize_dtype
from autonorm.errors import InputError

__all__ = ["NARROW", "dtype_or_none", "resolve_h_dtype"]

# The dtypes beside which a float32 residual stream may run (x, y and the weights in them).
NARROW = ("float16", "bfloat16")


def resolve_h_dtype(x_dtype: str, residual_dtype_of: str, residual_dtype: Any,
                    in_place: bool) -> str:
    """Return h's dtype name from the dtypes of x and the residual and ``residual_dtype``.

    The residual's own dtype must already be x's, or float32 beside a 16-bit x (the caller's
    check names the residual).

    Args:
        x_dtype: x's canonical dtype name.
        residual_dtype_of: the residual's canonical dtype name.
        residual_dtype: the caller's ``residual_dtype``: None (the residual's dtype), a dtype
            name or alias, a NumPy or torch dtype.
        in_place: whether h is written into the residual.

    Raises:
        autonorm.errors.InputError: ``residual_dtype`` is no dtype, neither x's nor float32,
            16-bit beside a float32 residual, or (``in_place``) not the residual's.

    """
    if residual_dtype is None:
        return residual_dtype_of
    want = dtype_or_none(residual_dtype)
    if want is None or want not in (x_dtype, "float32"):
        raise InputError(
            f"residual_dtype must be None, x's dtype ({x_dtype}) or float32, got "
            f"{residual_dtype!r}"
        )
    if want != residual_dtype_of and residual_dtype_of == "float32":
        raise InputError(
            f"residual_dtype {want} is not supported with a float32 residual: h of a float32 "
            "residual is float32 (pass residual_dtype=None or float32)"
        )
    if in_place and want != residual_dtype_of:
        raise InputError(
            f"residual_dtype {want} needs a {want} residual with in_place=True (the residual "
            f"receives h), got a {residual_dtype_of} one"
        )
    return want


def dtype_or_none(dtype: Any) -> str | None:
    """The canonical name of a dtype given by name, NumPy or torch dtype; None if it is none.

    A NumPy scalar type (``np.float32``) names no dtype by its ``str()``, so it goes through
    ``np.dtype``.
    """
    try:
        return normalize_dtype(dtype)
    except (ValueError, AttributeError, TypeError):  # an object whose name is no string
        pass
    if isinstance(dtype, type):
        try:
            return normalize_dtype(np.dtype(dtype))
        except (TypeError, ValueError):
            return None
    return None
