"""Validation of :func:`autonorm.torch.layer_norm`'s arguments, with errors that name the fault.

The hot path (:func:`autonorm.torch.forward.forward_cuda`) checks the common case inline and
comes here only for anything unusual, which either raises or is accepted (an int eps, say).
"""

from __future__ import annotations

import numbers

import torch

from autonorm.errors import DeviceMismatchError, InputError, ShapeError, UnsupportedDtypeError

# torch dtype -> autonorm dtype name; membership is the dtype check.
DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
}


def check_param(p: object, name: str, x: torch.Tensor, hidden: int) -> None:
    """Raise unless ``p`` is a 1-D tensor of ``hidden`` elements, x's dtype, on x's device."""
    if not isinstance(p, torch.Tensor):
        raise InputError(f"{name} must be a torch.Tensor or None, got {type(p).__name__}")
    if p.dim() != 1 or p.shape[0] != hidden:
        raise ShapeError(
            f"{name} must be 1-D with hidden={hidden} elements (the last dimension of x, shape "
            f"{tuple(x.shape)}), got shape {tuple(p.shape)}"
        )
    if p.dtype != x.dtype:
        raise UnsupportedDtypeError(
            f"{name} has dtype {p.dtype} but x has dtype {x.dtype}: they must be the same"
        )
    if p.device != x.device:
        raise DeviceMismatchError(f"{name} is on {p.device} but x is on {x.device}")


def as_float(eps: object) -> float:
    """Return eps as a float for the op's schema, raising InputError where a TypeError would."""
    if type(eps) is float:
        return eps
    # bool is an int, but True or False as eps is surely a mistake.
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise InputError(f"eps must be a positive number, got {eps!r}")
    return float(eps)


def validate(
    x: object, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: object
) -> int:
    """Check the arguments of :func:`autonorm.torch.layer_norm` and return the hidden size.

    Raises:
        InputError: x is not a tensor, or eps is not a positive number.
        UnsupportedDtypeError: a dtype is not float32/float16/bfloat16, or the dtypes differ.
        ShapeError: x is 0-d, or weight/bias is not 1-D of size hidden.
        DeviceMismatchError: weight or bias is not on x's device.

    """
    if not isinstance(x, torch.Tensor):
        raise InputError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in DTYPE_NAMES:
        raise UnsupportedDtypeError(
            f"x has dtype {x.dtype}: autonorm supports float32, float16 and bfloat16"
        )
    if x.dim() == 0:
        raise ShapeError("x must have shape (..., hidden), got a 0-d tensor")
    hidden = x.shape[-1]
    if weight is not None:
        check_param(weight, "weight", x, hidden)
    if bias is not None:
        check_param(bias, "bias", x, hidden)
    # `not eps > 0` also rejects NaN.
    if not as_float(eps) > 0:
        raise InputError(f"eps must be > 0, got {eps!r}")
    return hidden
