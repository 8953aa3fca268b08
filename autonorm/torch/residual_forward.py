"""The residual-add forwards: ``h = x + residual`` rounded to h's dtype, then the norm of ``h``.

h's dtype is the residual's: x's, or float32 beside a 16-bit x (a mixed-precision residual
stream, h the unrounded float32 sum and y the norm of it in x's dtype).

:func:`forward_add_rms_cuda` (RMSNorm) and :func:`forward_add_ln_cuda` (LayerNorm) are the hot
paths, functional (new y and h) or in place (vLLM's ``fused_add_rms_norm``: y over x, h over
residual). Each checks its common case inline and hands the launch to :func:`_launch_add`, which
both share, as they share :mod:`.forward`'s kernel caches, alignment and launch helpers.
:func:`forward_add_rms_reference` and :func:`forward_add_ln_reference` compute the same with
torch's ops on every other device. No autograd and no dispatch happen here; :mod:`.add_rms_op`
and :mod:`.add_ln_op` decide when to come here.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from autonorm.errors import InputError
from autonorm.torch.checks import (
    DTYPE_NAMES,
    NARROW_DTYPES,
    validate_add_ln,
    validate_add_rms,
)
from autonorm.torch.forward import (
    _ADD_LN_KERNELS,
    _ADD_RMS_KERNELS,
    _add_layer_norm_problem,
    _add_rms_norm_problem,
    _affine_fits,
    _current_device,
    _launch_cold,
    _raw_stream,
    aligned,
    forward_reference,
    forward_rms_reference,
)

__all__ = [
    "add_in_place_reference",
    "check_disjoint",
    "forward_add_ln_cuda",
    "forward_add_ln_reference",
    "forward_add_rms_cuda",
    "forward_add_rms_reference",
]

# The row count's position in the residual kernels' parameters (x, residual, weight, bias, y,
# h, rows, eps).
_ROWS_INDEX = 6


def forward_add_rms_cuda(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    weight_offset: bool,
    in_place: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the residual add + RMSNorm kernel on CUDA tensors: returns ``(y, h)``, no autograd.

    In place (vLLM's ``fused_add_rms_norm``) the kernel writes y over x and h over residual and
    returns them, without allocating; inputs it cannot write directly (strided, misaligned) are
    computed out of place and copied back. Otherwise y and h are new contiguous tensors.
    """
    device_id = x.get_device()
    if not (
        _operands_fit(x, residual, eps, device_id)
        and _affine_fits(weight, x.dtype, x.shape[-1], device_id)
        and (weight_offset is False or (weight_offset is True and weight is not None))
    ):
        validate_add_rms(x, residual, weight, eps, weight_offset)
    return _launch_add(
        _ADD_RMS_KERNELS, _add_rms_norm_problem, weight_offset, device_id, x, residual, weight,
        None, eps, in_place,
    )


def forward_add_ln_cuda(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    in_place: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the residual add + LayerNorm kernel on CUDA tensors: returns ``(y, h)``, no autograd.

    The same as :func:`forward_add_rms_cuda` with LayerNorm's statistics and an optional bias:
    in place, y over x and h over residual; otherwise new contiguous tensors.
    """
    device_id = x.get_device()
    if not (
        _operands_fit(x, residual, eps, device_id)
        and _affine_fits(weight, x.dtype, x.shape[-1], device_id)
        and _affine_fits(bias, x.dtype, x.shape[-1], device_id)
    ):
        validate_add_ln(x, residual, weight, bias, eps)
    return _launch_add(
        _ADD_LN_KERNELS, _add_layer_norm_problem, bias is not None, device_id, x, residual,
        weight, bias, eps, in_place,
    )


def _operands_fit(x: torch.Tensor, residual: object, eps: object, device_id: int) -> bool:
    """Fast-path check of x, residual and eps; anything unusual goes to the validators.

    The residual has x's dtype, or float32 beside a 16-bit x (a wide residual stream).
    """
    dtype = x.dtype
    shape = x.shape
    return bool(
        dtype in DTYPE_NAMES
        and shape
        and type(eps) is float
        and eps > 0
        and isinstance(residual, torch.Tensor)
        and (residual.dtype is dtype
             or (residual.dtype is torch.float32 and dtype in NARROW_DTYPES))
        and residual.shape == shape
        and residual.get_device() == device_id
    )


def _launch_add(
    cache: dict,
    problem_of: Callable[[tuple], object],
    flag: bool,
    device_id: int,
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    in_place: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch a residual kernel on validated CUDA tensors: ``(y, h)``, or ``(x, residual)``.

    ``cache`` and ``problem_of`` are the family's (:mod:`.forward`); ``flag`` is the key's
    fifth field, RMSNorm's weight_offset or LayerNorm's has_bias. h has the residual's dtype,
    which the key's last field holds (a float32 residual beside 16-bit x is a problem of its
    own, with ``residual_dtype``).
    """
    xp = x.data_ptr()
    rp = residual.data_ptr()
    if in_place:
        check_disjoint(x, residual)
        if (xp | rp) & 15 or not (x.is_contiguous() and residual.is_contiguous()):
            y, h = _launch_add(
                cache, problem_of, flag, device_id, x, residual, weight, bias, eps, False
            )
            x.copy_(y)
            residual.copy_(h)
            return x, residual
        y, h = x, residual
    else:
        # As in forward_cuda: aligned copies stay referenced until the launch is enqueued.
        if xp & 15 or not x.is_contiguous():
            x = aligned(x)
            xp = x.data_ptr()
        if rp & 15 or not residual.is_contiguous():
            residual = aligned(residual)
            rp = residual.data_ptr()
        y = torch.empty_like(x)
        h = torch.empty_like(residual)  # contiguous now, like x; in the residual's dtype
    wp = bp = 0
    if weight is not None:
        wp = weight.data_ptr()
        if wp & 15 or not weight.is_contiguous():
            weight = aligned(weight)
            wp = weight.data_ptr()
    if bias is not None:
        bp = bias.data_ptr()
        if bp & 15 or not bias.is_contiguous():
            bias = aligned(bias)
            bp = bias.data_ptr()
    hidden = x.shape[-1]
    rows = x.numel() // hidden if hidden else 0
    if rows == 0:
        return y, h
    bucket = 1 if rows <= 1 else 1 << (rows - 1).bit_length()  # ops.base.rows_bucket, inlined
    key = (device_id, x.dtype, hidden, weight is not None, flag, bucket, residual.dtype)
    args = (xp, rp, wp, bp, y.data_ptr(), h.data_ptr(), rows, float(eps))
    stream = _raw_stream(device_id)
    kernel = cache.get(key)
    if kernel is not None and device_id == _current_device():
        kernel.launch(args, stream)
    else:
        _launch_cold(cache, problem_of, key, args, stream, device_id, _ROWS_INDEX)
    return y, h


def forward_add_rms_reference(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    weight_offset: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Compute the residual add and RMSNorm with torch's own ops: returns new ``(y, h)``.

    A float32 residual beside a 16-bit x gives a float32 h, normalized in float32 with the
    weight in float32 and rounded once to x's dtype, as the kernel does.
    """
    validate_add_rms(x, residual, weight, eps, weight_offset)
    h = _rounded_sum(x, residual)
    if h.dtype is x.dtype:
        return forward_rms_reference(h, weight, eps, weight_offset), h
    w = None if weight is None else weight.float()
    return forward_rms_reference(h, w, eps, weight_offset).to(x.dtype), h


def forward_add_ln_reference(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Compute the residual add and LayerNorm with torch's own ops: returns new ``(y, h)``.

    A float32 residual beside a 16-bit x gives a float32 h, normalized in float32 with weight
    and bias in float32 and rounded once to x's dtype, as the kernel does.
    """
    validate_add_ln(x, residual, weight, bias, eps)
    h = _rounded_sum(x, residual)
    if h.dtype is x.dtype:
        return forward_reference(h, weight, bias, eps), h
    w = None if weight is None else weight.float()
    b = None if bias is None else bias.float()
    return forward_reference(h, w, b, eps).to(x.dtype), h


def _rounded_sum(x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """``x + residual`` taken in float32 and rounded once to h's (the residual's) dtype.

    Float32 has more than twice the bits of float16 and bfloat16, so that is the correctly
    rounded sum; for a float32 h (float32 inputs, or a float32 residual beside 16-bit x) it is
    the float32 sum itself, as the kernels compute it.
    """
    return (x.float() + residual.float()).to(residual.dtype).contiguous()


def add_in_place_reference(
    reference: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    x: torch.Tensor,
    residual: torch.Tensor,
    *args: object,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The in-place form with torch's ops: ``reference(x, residual, *args)``, then both copies.

    Both results are computed before either copy, and the reference validates the arguments
    before the disjointness check, so errors come in the order the kernel path gives them.
    """
    y, h = reference(x, residual, *args)
    check_disjoint(x, residual)
    x.copy_(y)
    residual.copy_(h)
    return x, residual


def check_disjoint(x: torch.Tensor, residual: torch.Tensor) -> None:
    """Raise InputError if x and residual share memory (the in-place form writes both)."""
    xs, xe = _extent(x)
    rs, re = _extent(residual)
    if xs < re and rs < xe:
        raise InputError(
            "residual shares memory with x: the in-place form writes both, so they must be "
            "separate tensors"
        )


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """The byte range [start, end) a tensor's elements lie in; empty for an empty tensor."""
    if t.numel() == 0:
        return 0, 0
    start = t.data_ptr()
    if t.is_contiguous():
        return start, start + t.numel() * t.element_size()
    span = 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride(), strict=True))
    return start, start + span * t.element_size()
