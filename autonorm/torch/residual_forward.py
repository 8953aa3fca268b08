"""The residual-add forwards: ``h = x + residual`` rounded to the dtype, then RMSNorm of ``h``.

:func:`forward_add_rms_cuda` is the hot path, functional (new y and h) or in place (vLLM's
``fused_add_rms_norm``: y over x, h over residual), written out flat like
:func:`autonorm.torch.forward.forward_rms_cuda`, whose kernel cache, alignment and launch
helpers it shares. :func:`forward_add_rms_reference` computes the same with torch's ops on every
other device. No autograd and no dispatch happen here; :mod:`.add_rms_op` decides when to come
here.
"""

from __future__ import annotations

import torch

from autonorm.errors import InputError
from autonorm.torch.checks import DTYPE_NAMES, validate_add_rms
from autonorm.torch.forward import (
    _ADD_RMS_KERNELS,
    _add_rms_norm_problem,
    _affine_fits,
    _aligned,
    _current_device,
    _launch_cold,
    _raw_stream,
    forward_rms_reference,
)

__all__ = ["check_disjoint", "forward_add_rms_cuda", "forward_add_rms_reference"]

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
    dtype = x.dtype
    shape = x.shape
    device_id = x.get_device()
    hidden = shape[-1] if shape else 0
    if not (
        dtype in DTYPE_NAMES
        and shape
        and type(eps) is float
        and eps > 0
        and isinstance(residual, torch.Tensor)
        and residual.dtype is dtype
        and residual.shape == shape
        and residual.get_device() == device_id
        and _affine_fits(weight, dtype, hidden, device_id)
        and (weight_offset is False or (weight_offset is True and weight is not None))
    ):
        validate_add_rms(x, residual, weight, eps, weight_offset)
    xp = x.data_ptr()
    rp = residual.data_ptr()
    if in_place:
        check_disjoint(x, residual)
        if (xp | rp) & 15 or not (x.is_contiguous() and residual.is_contiguous()):
            y, h = forward_add_rms_cuda(x, residual, weight, eps, weight_offset)
            x.copy_(y)
            residual.copy_(h)
            return x, residual
        y, h = x, residual
    else:
        # As in forward_cuda: aligned copies stay referenced until the launch is enqueued.
        if xp & 15 or not x.is_contiguous():
            x = _aligned(x)
            xp = x.data_ptr()
        if rp & 15 or not residual.is_contiguous():
            residual = _aligned(residual)
            rp = residual.data_ptr()
        y = torch.empty_like(x)
        h = torch.empty_like(x)
    wp = 0
    if weight is not None:
        wp = weight.data_ptr()
        if wp & 15 or not weight.is_contiguous():
            weight = _aligned(weight)
            wp = weight.data_ptr()
    rows = x.numel() // hidden if hidden else 0
    if rows == 0:
        return y, h
    bucket = 1 if rows <= 1 else 1 << (rows - 1).bit_length()  # ops.base.rows_bucket, inlined
    key = (device_id, dtype, hidden, weight is not None, weight_offset, bucket)
    args = (xp, rp, wp, 0, y.data_ptr(), h.data_ptr(), rows, float(eps))
    stream = _raw_stream(device_id)
    kernel = _ADD_RMS_KERNELS.get(key)
    if kernel is not None and device_id == _current_device():
        kernel.launch(args, stream)
    else:
        _launch_cold(
            _ADD_RMS_KERNELS, _add_rms_norm_problem, key, args, stream, device_id, _ROWS_INDEX
        )
    return y, h


def forward_add_rms_reference(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    weight_offset: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Compute the residual add and RMSNorm with torch's own ops: returns new ``(y, h)``.

    The sum is taken in float32 and rounded once to x's dtype, as the kernel does (float32 has
    more than twice the bits of float16 and bfloat16, so that is the correctly rounded sum).
    """
    validate_add_rms(x, residual, weight, eps, weight_offset)
    h = (x.float() + residual.float()).to(x.dtype).contiguous()
    return forward_rms_reference(h, weight, eps, weight_offset), h


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
