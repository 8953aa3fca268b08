"""Validation of autonorm.torch's arguments (LayerNorm, RMSNorm), with errors that name the fault.

The hot path (:func:`autonorm.torch.forward.forward_cuda`) checks the common case inline and
comes here only for anything unusual, which either raises or is accepted (an int eps, say).
"""

from __future__ import annotations

import numbers

import torch

from autonorm.errors import DeviceMismatchError, InputError, ShapeError, UnsupportedDtypeError
from autonorm.residual_dtype import NARROW

# torch dtype -> autonorm dtype name; membership is the dtype check.
DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
}
# The dtypes beside which a float32 residual stream (and h) may run: residual_dtype's NARROW.
NARROW_DTYPES = tuple(t for t, name in DTYPE_NAMES.items() if name in NARROW)


def check_param(p: object, name: str, x: torch.Tensor, hidden: int) -> None:
    """Raise unless ``p`` is a 1-D tensor of ``hidden`` elements, x's dtype, on x's device."""
    check_tensor_or_none(p, name)
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


def check_optional_tensors(weight: object, bias: object) -> None:
    """Raise InputError naming weight or bias where one is neither a tensor nor None.

    For the paths that read a parameter's attributes (requires_grad, dtype) or bind the op's
    schema before :func:`validate` runs: their own errors (an AttributeError, the schema's
    RuntimeError) would not say which argument is wrong. A call in torch.nn.functional's order,
    ``layer_norm(x, (hidden,))``, is the usual way to get here.
    """
    check_tensor_or_none(weight, "weight")
    check_tensor_or_none(bias, "bias")


def check_tensor_or_none(value: object, name: str) -> None:
    """Raise InputError naming ``name`` unless ``value`` is a tensor or None."""
    if value is not None and not isinstance(value, torch.Tensor):
        raise InputError(f"{name} must be a torch.Tensor or None, got {type(value).__name__}")


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


def check_weight_offset(weight_offset: object, weight: torch.Tensor | None) -> None:
    """Raise unless ``weight_offset`` is a bool, and True only with a weight to offset."""
    if type(weight_offset) is not bool:
        raise InputError(
            f"weight_offset must be True or False, got {type(weight_offset).__name__} "
            f"{weight_offset!r}"
        )
    if weight_offset and weight is None:
        raise InputError("weight_offset=True scales by 1 + weight: it needs a weight")


def validate_rms(
    x: object, weight: torch.Tensor | None, eps: object, weight_offset: object
) -> int:
    """Check the arguments of :func:`autonorm.torch.rms_norm` and return the hidden size.

    Raises:
        InputError: as :func:`validate` does, or weight_offset is no bool or has no weight.

    """
    hidden = validate(x, weight, None, eps)
    check_weight_offset(weight_offset, weight)
    return hidden


def validate_add_rms(
    x: object,
    residual: object,
    weight: torch.Tensor | None,
    eps: object,
    weight_offset: object,
) -> int:
    """Check the arguments of :func:`autonorm.torch.add_rms_norm` and return the hidden size.

    Raises:
        InputError: as :func:`validate_rms` does, or as :func:`check_residual` does.
        ShapeError, UnsupportedDtypeError, DeviceMismatchError: as :func:`check_residual` does.

    """
    hidden = validate_rms(x, weight, eps, weight_offset)
    check_residual(x, residual)
    return hidden


def validate_add_ln(
    x: object,
    residual: object,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: object,
) -> int:
    """Check the arguments of :func:`autonorm.torch.add_layer_norm` and return the hidden size.

    Raises:
        InputError: as :func:`validate` does, or as :func:`check_residual` does.
        ShapeError, UnsupportedDtypeError, DeviceMismatchError: as :func:`check_residual` does.

    """
    hidden = validate(x, weight, bias, eps)
    check_residual(x, residual)
    return hidden


def check_residual(x: torch.Tensor, residual: object) -> None:
    """Raise unless ``residual`` is a tensor of x's shape and device, of x's dtype or float32.

    Float32 is allowed beside a 16-bit x only: a mixed-precision residual stream, whose h is
    float32 too.

    Raises:
        InputError: residual is not a tensor.
        ShapeError: residual's shape is not x's.
        UnsupportedDtypeError: residual's dtype is neither x's nor float32 beside a 16-bit x.
        DeviceMismatchError: residual is not on x's device.

    """
    if not isinstance(residual, torch.Tensor):
        raise InputError(f"residual must be a torch.Tensor like x, got {type(residual).__name__}")
    if residual.shape != x.shape:
        raise ShapeError(
            f"residual must have x's shape {tuple(x.shape)}, got {tuple(residual.shape)}"
        )
    if residual.dtype != x.dtype and not (
        residual.dtype == torch.float32 and x.dtype in NARROW_DTYPES
    ):
        raise UnsupportedDtypeError(
            f"residual has dtype {residual.dtype} but x has dtype {x.dtype}: it must be x's "
            "dtype, or float32 beside a 16-bit x"
        )
    if residual.device != x.device:
        raise DeviceMismatchError(f"residual is on {residual.device} but x is on {x.device}")


def check_flag(value: object, name: str) -> None:
    """Raise InputError naming ``name`` unless ``value`` is True or False."""
    if type(value) is not bool:
        raise InputError(f"{name} must be True or False, got {type(value).__name__} {value!r}")


def check_tensors(x: object, residual: object) -> None:
    """Raise InputError naming x or residual where one is no tensor (before an op's schema)."""
    for name, t in (("x", x), ("residual", residual)):
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
