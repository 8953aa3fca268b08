"""The custom op ``torch.ops.autonorm.rms_norm`` and the public :func:`rms_norm`.

The op is what autograd, ``torch.compile``, tensor subclasses and dispatch modes see: a fake
(meta) implementation for tracing, an autograd formula in PyTorch ops (the root mean square
recomputed in float32) and an autocast rule. :func:`rms_norm` goes through the op only where one
of those needs it; eager inference goes straight to
:func:`autonorm.torch.forward.forward_rms_cuda`. The same routing as LayerNorm's
(:mod:`.custom_op`).
"""

from __future__ import annotations

import torch

from autonorm.errors import InputError
from autonorm.torch import backward_op
from autonorm.torch.checks import (
    as_float,
    check_optional_tensors,
    check_weight_offset,
    validate_rms,
)
from autonorm.torch.custom_op import (
    any_autocast,
    apply_autocast,
    dispatch_modes,
    torch_autocasts_to_fp32,
)
from autonorm.torch.forward import forward_rms_cuda, forward_rms_reference

__all__ = ["DEFAULT_EPS", "rms_norm", "rms_norm_grads"]

# torch's rms_norm with eps=None takes the machine epsilon of its computation type, float32 for
# float32, float16 and bfloat16 inputs alike (not bfloat16's own, which is 2^-7).
DEFAULT_EPS = torch.finfo(torch.float32).eps

_Tensor = torch.Tensor
_is_compiling = torch.compiler.is_compiling
_is_grad_enabled = torch.is_grad_enabled


@torch.library.custom_op(
    "autonorm::rms_norm",
    mutates_args=(),
    schema="(Tensor x, Tensor? weight, float eps, bool weight_offset) -> Tensor",
)
def _rms_norm_op(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, weight_offset: bool
) -> torch.Tensor:
    if x.is_cuda:
        return forward_rms_cuda(x, weight, eps, weight_offset)
    return forward_rms_reference(x, weight, eps, weight_offset)


@_rms_norm_op.register_fake
def _rms_norm_fake(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, weight_offset: bool
) -> torch.Tensor:
    # Validating here makes torch.compile report bad inputs at trace time, as eager would.
    validate_rms(x, weight, eps, weight_offset)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _setup_context(ctx: object, inputs: tuple, output: torch.Tensor) -> None:
    x, weight, eps, weight_offset = inputs
    # The root mean square is recomputed in backward: one more read of x, no extra activation.
    ctx.save_for_backward(x, weight)
    ctx.eps = eps
    ctx.weight_offset = weight_offset


def _backward(ctx: object, grad_y: torch.Tensor) -> tuple:
    """Gradients of y = x * rstd * w (w = weight or 1 + weight), computed in float32."""
    x, weight = ctx.saved_tensors
    needs_x, needs_w = ctx.needs_input_grad[:2]
    if needs_x and backward_op.supports(x, grad_y):
        # One launch of the tuned backward kernel; the weight's sum comes with dx.
        dx, dw, _ = backward_op.norm_backward(grad_y, x, weight, rms=True,
                                              weight_offset=ctx.weight_offset, eps=ctx.eps)
        return dx, (dw if needs_w else None), None, None
    grad_x, grad_w = rms_norm_grads(x, weight, grad_y, ctx.eps, ctx.weight_offset, needs_x, needs_w)
    return (None if grad_x is None else grad_x.to(x.dtype)), grad_w, None, None


def rms_norm_grads(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    grad_y: torch.Tensor,
    eps: float,
    weight_offset: bool,
    needs_x: bool,
    needs_w: bool,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Return the gradients of y = x * rstd * w with respect to x and the weight.

    The root mean square is recomputed from ``x`` in float32. The x gradient stays in float32
    (callers round it once, after adding any other gradient of x); the weight gradient is in
    the weight's dtype. Each is None where not needed (or without a weight).
    """
    xf = x.float()
    rstd = torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    xhat = xf * rstd
    dy = grad_y.float()
    # The weight gradient sums over every leading dim; a 1-D x has none (sum(()) would reduce
    # over all dims instead).
    lead = tuple(range(x.dim() - 1))
    grad_x = grad_w = None
    if needs_x:
        if weight is None:
            g = dy
        else:
            w = weight.float()
            g = dy * (1.0 + w if weight_offset else w)
        grad_x = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
    if needs_w and weight is not None:
        # d(1 + weight)/d weight is one: the offset form has the same weight gradient.
        gw = dy * xhat
        grad_w = (gw.sum(lead) if lead else gw).to(weight.dtype)
    return grad_x, grad_w


_rms_norm_op.register_autograd(_backward, setup_context=_setup_context)

# Where this torch build's CUDA autocast runs rms_norm in float32 (its fp32 op list, as for
# layer_norm), so does the op; elsewhere (torch 2.11: rms_norm keeps the input's dtype) and under
# CPU autocast, the eager wrapper matches torch (see apply_autocast).
CUDA_FP32 = torch_autocasts_to_fp32("aten::rms_norm")
if CUDA_FP32 and hasattr(torch.library, "register_autocast"):  # torch >= 2.5
    torch.library.register_autocast("autonorm::rms_norm", "cuda", torch.float32)

_OP = torch.ops.autonorm.rms_norm.default


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float | None = None,
    weight_offset: bool = False,
) -> torch.Tensor:
    """Scale the last dimension of ``x`` by its root mean square with the autonorm kernel.

    ``y = x / sqrt(mean(x^2) + eps) * w`` over the last dimension, like
    ``torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)``, with ``w`` the weight, or
    ``1 + weight`` where ``weight_offset`` (Gemma's form: the one is added in float32, not in the
    weight's dtype), or one without a weight. Statistics in float32, the output rounded once.

    On CUDA the kernel reads ``x`` in place and writes a new tensor allocated by torch, on torch's
    current stream of ``x``'s device, so calls can be captured in a CUDA graph. Non-contiguous or
    misaligned inputs are copied first; the output is always contiguous. Tensors on other devices
    are computed with ``torch.nn.functional.rms_norm`` (the offset form in float32 PyTorch ops).
    Autocast casts as it does for torch's rms_norm (float32 under CUDA autocast). Gradients flow
    to x and weight; ``torch.compile`` sees the custom op ``torch.ops.autonorm.rms_norm`` without
    a graph break.

    The first call for a new (device, dtype, hidden size, weight form, row-count bucket) looks
    the kernel up in the tuning database and compiles it; do that before capturing a CUDA graph.

    Args:
        x: input of shape (..., hidden); float32, float16 or bfloat16.
        weight: optional scale of shape (hidden,), same dtype and device as x.
        eps: added to the mean of squares; must be > 0. None takes torch's default, float32's
            machine epsilon (:data:`DEFAULT_EPS`).
        weight_offset: scale by ``1 + weight`` instead of ``weight`` (needs a weight).

    Returns:
        A new contiguous tensor of x's shape, dtype and device.

    Raises:
        autonorm.errors.InputError: x or weight is not a tensor (weight may be None), eps <= 0,
            or weight_offset is no bool or has no weight.
        autonorm.errors.UnsupportedDtypeError: a dtype is unsupported, or the dtypes differ.
        autonorm.errors.ShapeError: x is 0-d, or weight is not (hidden,).
        autonorm.errors.DeviceMismatchError: weight is on another device than x.

    """
    if eps is None:
        eps = DEFAULT_EPS
    if _is_compiling():
        check_optional_tensors(weight, None)
        check_weight_offset(weight_offset, weight)
        return _OP(x, weight, as_float(eps), weight_offset)
    if type(x) is not _Tensor or dispatch_modes():
        # Subclasses (Parameter, FakeTensor, DTensor) and dispatch modes go through the op.
        if not isinstance(x, torch.Tensor):
            raise InputError(f"x must be a torch.Tensor, got {type(x).__name__}")
        check_optional_tensors(weight, None)
        check_weight_offset(weight_offset, weight)
        if any_autocast():
            x, weight, _ = apply_autocast(x, weight, None, cuda_fp32=CUDA_FP32)
        return _OP(x, weight, as_float(eps), weight_offset)
    if any_autocast():
        x, weight, _ = apply_autocast(x, weight, None, cuda_fp32=CUDA_FP32)
    try:
        needs_grad = _is_grad_enabled() and (
            x.requires_grad or (weight is not None and weight.requires_grad)
        )
    except AttributeError:  # a weight that is no tensor: name it, not what it lacks
        check_optional_tensors(weight, None)
        raise
    if needs_grad:
        check_optional_tensors(weight, None)  # x's requires_grad may not have read it
        check_weight_offset(weight_offset, weight)
        return _OP(x, weight, as_float(eps), weight_offset)
    if x.is_cuda:
        return forward_rms_cuda(x, weight, eps, weight_offset)
    return forward_rms_reference(x, weight, eps, weight_offset)
