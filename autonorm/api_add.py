"""The fused residual add and norm: :func:`add_rms_norm` and :func:`add_layer_norm`.

``h = x + residual`` rounded to h's dtype, then ``y = norm(h)``: the pre-norm sum of a
transformer block and its norm in one pass. h's dtype is x's, or float32 beside a 16-bit x for a
mixed-precision residual stream (a float32 residual, or ``residual_dtype="float32"``). CuPy
arrays run the tuned kernel of the norm's family with the residual add; torch tensors go to
:mod:`autonorm.torch`; NumPy arrays are computed on the CPU in float64, with the same single
rounding of the sum.
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
from autonorm.dtypes import normalize_dtype
from autonorm.errors import InputError, UnsupportedDtypeError
from autonorm.ops.layer_norm.problem import Problem as LayerNormProblem
from autonorm.ops.rms_norm.problem import Problem
from autonorm.residual_dtype import NARROW, dtype_or_none, resolve_h_dtype

__all__ = ["add_layer_norm", "add_rms_norm"]


def add_rms_norm(
    x: Any,
    residual: Any,
    weight: Any = None,
    eps: float = 1e-6,
    *,
    weight_offset: bool = False,
    in_place: bool = False,
    residual_dtype: Any = None,
) -> tuple[Any, Any]:
    """Add ``residual`` to ``x`` and RMSNorm the sum: return ``(y, h)``.

    ``h = x + residual``, computed in float32 (float64 for NumPy) and rounded once to h's dtype;
    ``y = h / sqrt(mean(h^2) + eps) * w`` over the last dimension, the norm of exactly the ``h``
    returned, rounded to x's dtype. ``w`` is ``weight``, ``1 + weight`` with ``weight_offset``
    (Gemma's form), or one without a weight. With ``in_place``, vLLM's ``fused_add_rms_norm``:
    ``y`` is written into ``x`` and ``h`` into ``residual``, which are returned. The functional
    and in-place forms give the same bits.

    h's dtype is ``residual_dtype`` if given, else the residual's. A mixed-precision residual
    stream keeps the residual and ``h`` in float32 beside a 16-bit x: h is then the float32 sum
    ``float(x) + residual``, not rounded to 16 bits, and y its norm in x's dtype. A 16-bit
    residual with ``residual_dtype="float32"`` is converted to float32 first, an extra pass over
    it; a float32 residual always gives a float32 h.

    Accepts CuPy arrays (the tuned kernel on x's GPU, on CuPy's current stream), torch tensors
    (see :func:`autonorm.torch.add_rms_norm`) and NumPy arrays (computed on the CPU in float64).

    Args:
        x: input of shape (..., hidden), float32, float16 or bfloat16.
        residual: the residual stream, x's shape and kind (and GPU); x's dtype, or float32
            beside a 16-bit x.
        weight: optional scale of shape (hidden,), same dtype as x.
        eps: added to the mean of squares; a finite real number > 0.
        weight_offset: scale by ``1 + weight`` instead of ``weight`` (needs a weight).
        in_place: write ``y`` into ``x`` and ``h`` into ``residual`` (which must not share
            memory) instead of new arrays; h's dtype must then be the residual's.
        residual_dtype: h's dtype, x's or float32 (a name or alias such as ``"fp32"``, a
            NumPy or torch dtype); None takes the residual's.

    Returns:
        ``(y, h)``, arrays of x's shape and kind, y in x's dtype and h in h's;
        ``(x, residual)`` with ``in_place``.

    Raises:
        autonorm.errors.InputError: bad dtype, shape, device, eps, weight_offset, in_place or
            residual_dtype (subclasses name which).

    """
    module = type(x).__module__
    if module.startswith("torch"):
        from autonorm import torch as autonorm_torch

        return autonorm_torch.add_rms_norm(
            x, residual, weight, eps, weight_offset, in_place, residual_dtype=residual_dtype
        )
    _check_in_place(in_place)
    check_weight_offset(weight_offset, weight)
    if isinstance(x, np.ndarray):
        from autonorm.ops.rms_norm.reference import rms_norm_reference

        _, _, _, residual = _validate(x, residual, weight, None, eps, bool(in_place),
                                      residual_dtype)
        w64 = None if weight is None else np.asarray(weight, dtype=np.float64)
        return _add_numpy(
            x, residual, lambda h64: rms_norm_reference(h64, w64, float(eps),
                                                         bool(weight_offset)),
            bool(in_place),
        )
    _check_cupy(x, torch_too=True)
    dtype, rows, hidden, residual = _validate(x, residual, weight, None, eps, bool(in_place),
                                              residual_dtype)
    problem = Problem(hidden, dtype, weight is not None, bool(weight_offset), residual=True,
                      residual_dtype=_wide(dtype, residual))
    return _launch_cupy(problem, rows, x, residual, weight, None, float(eps), bool(in_place))


def add_layer_norm(
    x: Any,
    residual: Any,
    weight: Any = None,
    bias: Any = None,
    eps: float = 1e-5,
    *,
    in_place: bool = False,
    residual_dtype: Any = None,
) -> tuple[Any, Any]:
    """Add ``residual`` to ``x`` and LayerNorm the sum: return ``(y, h)``.

    ``h = x + residual``, computed in float32 (float64 for NumPy) and rounded once to h's dtype;
    ``y = (h - mean) / sqrt(var + eps) * weight + bias`` over the last dimension, the norm of
    exactly the ``h`` returned, rounded to x's dtype. With ``in_place``, ``y`` is written into
    ``x`` and ``h`` into ``residual``, which are returned (vLLM's form of the fused add); both
    forms give the same bits.

    h's dtype is ``residual_dtype`` if given, else the residual's: float32 beside a 16-bit x
    keeps a mixed-precision residual stream, h the float32 sum ``float(x) + residual`` (not
    rounded to 16 bits). A 16-bit residual with ``residual_dtype="float32"`` is converted to
    float32 first, an extra pass over it; a float32 residual always gives a float32 h.

    Accepts CuPy arrays (the tuned kernel on x's GPU, on CuPy's current stream), torch tensors
    (see :func:`autonorm.torch.add_layer_norm`) and NumPy arrays (computed on the CPU in
    float64).

    Args:
        x: input of shape (..., hidden), float32, float16 or bfloat16.
        residual: the residual stream, x's shape and kind (and GPU); x's dtype, or float32
            beside a 16-bit x.
        weight: optional scale of shape (hidden,), same dtype as x.
        bias: optional shift of shape (hidden,), same dtype as x.
        eps: added to the variance; a finite real number > 0.
        in_place: write ``y`` into ``x`` and ``h`` into ``residual`` (which must not share
            memory) instead of new arrays; h's dtype must then be the residual's.
        residual_dtype: h's dtype, x's or float32 (a name or alias such as ``"fp32"``, a
            NumPy or torch dtype); None takes the residual's.

    Returns:
        ``(y, h)``, arrays of x's shape and kind, y in x's dtype and h in h's;
        ``(x, residual)`` with ``in_place``.

    Raises:
        autonorm.errors.InputError: bad dtype, shape, device, eps, in_place or residual_dtype
            (subclasses name which).

    """
    _check_in_place(in_place)
    if type(x).__module__.startswith("torch"):
        from autonorm import torch as autonorm_torch

        return autonorm_torch.add_layer_norm(x, residual, weight, bias, eps, in_place=in_place,
                                             residual_dtype=residual_dtype)
    if isinstance(x, np.ndarray):
        from autonorm.ops.layer_norm.reference import layer_norm_reference

        _, _, _, residual = _validate(x, residual, weight, bias, eps, bool(in_place),
                                      residual_dtype)
        w64 = None if weight is None else np.asarray(weight, dtype=np.float64)
        b64 = None if bias is None else np.asarray(bias, dtype=np.float64)
        return _add_numpy(
            x, residual, lambda h64: layer_norm_reference(h64, w64, b64, float(eps)),
            bool(in_place),
        )
    _check_cupy(x, torch_too=True)
    dtype, rows, hidden, residual = _validate(x, residual, weight, bias, eps, bool(in_place),
                                              residual_dtype)
    problem = LayerNormProblem(hidden, dtype, weight is not None, bias is not None,
                               residual=True, residual_dtype=_wide(dtype, residual))
    return _launch_cupy(problem, rows, x, residual, weight, bias, float(eps), bool(in_place))


def _wide(dtype: str, residual: Any) -> str | None:
    """The problem's residual_dtype: float32 where a validated residual is wider than x."""
    return "float32" if dtype in NARROW and residual.dtype.name == "float32" else None


def _check_in_place(in_place: Any) -> None:
    if not isinstance(in_place, (bool, np.bool_)):
        raise InputError(
            f"in_place must be True or False, got {type(in_place).__name__} {in_place!r}"
        )


def _check_cupy(x: Any, torch_too: bool) -> None:
    """Refuse an x that is not a CuPy array (NumPy arrays and torch tensors went elsewhere)."""
    if not type(x).__module__.startswith("cupy"):
        kinds = "a CuPy array, a torch tensor or a NumPy array" if torch_too else (
            "a CuPy array or a NumPy array")
        raise InputError(f"x must be {kinds}, got {type(x).__name__}")


def _validate(
    x: Any, residual: Any, weight: Any, bias: Any, eps: Any, in_place: bool,
    residual_dtype: Any = None,
) -> tuple[str, int, int, Any]:
    """Check the arguments; return :func:`autonorm.api.validate`'s result and the residual.

    The residual returned is the one the kernel reads: the caller's, or its float32 copy where
    ``residual_dtype`` asks a 16-bit residual for a float32 h. In place, x and residual must not
    share memory: each is written, with the other's result read from the same rows.
    """
    dtype, rows, hidden = validate(x, weight, bias, eps)
    if residual is None:
        raise InputError(f"residual must be an array of x's shape {tuple(x.shape)}, got None")
    _check_residual(x, residual, dtype)
    have = normalize_dtype(residual.dtype)
    want = resolve_h_dtype(dtype, have, residual_dtype, in_place)
    if in_place and _kind_module(x).may_share_memory(x, residual):
        raise InputError(
            "residual shares memory with x: in_place writes both, so they must be separate"
        )
    if want != have:
        residual = _as_float32(x, residual)
    return dtype, rows, hidden, residual


def _as_float32(x: Any, residual: Any) -> Any:
    """A copy of a 16-bit residual in float32 (exact), on x's GPU for CuPy arrays."""
    if isinstance(x, np.ndarray):
        return residual.astype(np.float32)
    import cupy

    # Checked before the copy: a residual on another GPU would be converted there.
    check_same_gpu(x.device.id, residual=residual)
    with cupy.cuda.Device(x.device.id):
        return residual.astype(cupy.float32)


def _check_residual(x: Any, residual: Any, dtype: str) -> None:
    """Raise unless ``residual`` is an array of x's kind and shape, of x's dtype or float32.

    Float32 is allowed beside a 16-bit x only (a mixed-precision residual stream).
    """
    try:
        check_like_x(x, "residual", residual, tuple(x.shape), "x's shape", optional=False)
    except UnsupportedDtypeError:
        # check_like_x compares the dtypes last, so kind and shape have passed here; an
        # unsupported dtype (float64) fails in dtype_or_none as well and is re-raised.
        got = dtype_or_none(residual.dtype)
        if got is None:
            raise
        if not (got == "float32" and dtype in NARROW):
            raise UnsupportedDtypeError(
                f"residual dtype {residual.dtype} differs from x dtype {x.dtype}: it must be x's "
                "dtype, or float32 beside a 16-bit x"
            ) from None


def _kind_module(x: Any) -> Any:
    """NumPy or CuPy, whichever x belongs to."""
    if isinstance(x, np.ndarray):
        return np
    import cupy

    return cupy


def rounded_sum(x: np.ndarray, residual: np.ndarray, dtype: Any = None) -> np.ndarray:
    """Return ``x + residual`` computed in float64 and rounded once to h's dtype.

    Float64 holds more than twice the bits of float32 and float16, so rounding the float64 sum
    to them gives the correctly rounded sum, the bits the kernel's float32 sum rounds to (for a
    float32 h the kernel's float32 add is itself that rounding).

    Args:
        x: the input.
        residual: the residual, x's shape.
        dtype: h's dtype; None takes the residual's (h's wherever the residual is the one the
            kernel reads).

    """
    out = residual.dtype if dtype is None else dtype
    with np.errstate(over="ignore"):  # a sum past the dtype's range is inf, as in the kernel
        return (x.astype(np.float64) + residual.astype(np.float64)).astype(out)


def _add_numpy(
    x: np.ndarray, residual: Any, norm64: Any, in_place: bool
) -> tuple[np.ndarray, np.ndarray]:
    """The CPU path on validated arrays: the rounded sum, then ``norm64`` of it.

    ``norm64`` takes and returns float64; its result is rounded once to x's dtype, so a
    float32 h beside a 16-bit x gives y as the kernel does, not rounded through float32 first.
    """
    h = rounded_sum(x, residual)
    y = norm64(h.astype(np.float64)).astype(x.dtype)
    if not in_place:
        return y, h
    for name, a in (("x", x), ("residual", residual)):
        if not a.flags.writeable:
            raise InputError(f"{name} is read-only: in_place writes into it")
    x[...] = y
    residual[...] = h
    return x, residual


def _launch_cupy(
    problem: Any, rows: int, x: Any, residual: Any, weight: Any, bias: Any, eps: float,
    in_place: bool,
) -> tuple[Any, Any]:
    """Run the dispatched residual-add kernel on validated CuPy arrays.

    In place on contiguous, aligned arrays the kernel writes y over x and h over residual (each
    element is read before it is written, by the thread that writes it); otherwise it writes new
    arrays, copied back into x and residual where asked. h has the residual's dtype (float32
    beside a 16-bit x for the problem's wide residual).
    """
    import cupy

    from autonorm.dispatch import get_kernel

    device_id = x.device.id
    check_same_gpu(device_id, residual=residual, weight=weight, bias=bias)
    with cupy.cuda.Device(device_id):
        w = None if weight is None else aligned_contiguous(weight)
        b = None if bias is None else aligned_contiguous(bias)
        if in_place and all(a.flags.c_contiguous and a.data.ptr % 16 == 0 for a in (x, residual)):
            if rows:
                kernel = get_kernel(problem, rows, device_id)
                kernel.launch_arrays(x, residual, w, b, x, residual, rows, eps)
            return x, residual
        xc, rc = aligned_contiguous(x), aligned_contiguous(residual)
        y = cupy.empty(x.shape, dtype=x.dtype)
        h = cupy.empty(x.shape, dtype=residual.dtype)
        if rows:
            get_kernel(problem, rows, device_id).launch_arrays(xc, rc, w, b, y, h, rows, eps)
        if not in_place:
            return y, h
        x[...] = y
        residual[...] = h
    return x, residual
