"""The custom op ``torch.ops.autonorm.layer_norm`` and the public :func:`layer_norm`.

The op is what autograd, ``torch.compile``, tensor subclasses and dispatch modes see: a fake
(meta) implementation for tracing, an autograd formula in PyTorch ops (mean and rstd recomputed
in float32) and an autocast rule. :func:`layer_norm` goes through the op only where one of those
needs it; eager inference goes straight to :func:`autonorm.torch.forward.forward_cuda`.
"""

from __future__ import annotations

import torch

from autonorm.errors import InputError
from autonorm.torch import backward_op
from autonorm.torch.checks import DTYPE_NAMES, as_float, check_optional_tensors, validate
from autonorm.torch.forward import forward_cuda, forward_reference

__all__ = ["layer_norm", "layer_norm_grads"]

_Tensor = torch.Tensor
_is_compiling = torch.compiler.is_compiling
_is_grad_enabled = torch.is_grad_enabled
_is_autocast_enabled = torch.is_autocast_enabled
# Any autocast at all (one C call), so the common no-autocast case skips the per-device query.
any_autocast = getattr(torch._C, "_is_any_autocast_enabled", None) or (
    lambda: _is_autocast_enabled("cuda") or _is_autocast_enabled("cpu")
)
# Number of active TorchDispatchModes (make_fx, FlopCounterMode, ...): they must see the op.
dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", None) or (lambda: 0)


# An explicit schema: with postponed annotations, inferring it from type hints is fragile.
@torch.library.custom_op(
    "autonorm::layer_norm",
    mutates_args=(),
    schema="(Tensor x, Tensor? weight, Tensor? bias, float eps) -> Tensor",
)
def _layer_norm_op(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
) -> torch.Tensor:
    if x.is_cuda:
        return forward_cuda(x, weight, bias, eps)
    return forward_reference(x, weight, bias, eps)


@_layer_norm_op.register_fake
def _layer_norm_fake(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
) -> torch.Tensor:
    # Validating here makes torch.compile report bad inputs at trace time, as eager would.
    validate(x, weight, bias, eps)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _setup_context(ctx: object, inputs: tuple, output: torch.Tensor) -> None:
    x, weight, bias, eps = inputs
    # Only x (and weight, which autograd keeps alive anyway) are saved: mean and rstd are
    # recomputed in backward, which costs one more read of x but no extra activation memory.
    ctx.save_for_backward(x, weight)
    ctx.eps = eps
    ctx.has_bias = bias is not None


def _backward(ctx: object, grad_y: torch.Tensor) -> tuple:
    """Gradients of y = (x - mean) * rstd * weight + bias, computed in float32."""
    x, weight = ctx.saved_tensors
    needs_x, needs_w, needs_b = ctx.needs_input_grad[:3]
    if needs_x and backward_op.supports(x, grad_y):
        # One launch of the tuned backward kernel; the weight and bias sums come with dx.
        dx, dw, db = backward_op.norm_backward(grad_y, x, weight, rms=False,
                                               has_bias=ctx.has_bias, eps=ctx.eps)
        return dx, (dw if needs_w else None), (db if needs_b else None), None
    grad_x, grad_w, grad_b = layer_norm_grads(
        x, weight, grad_y, ctx.eps, needs_x, needs_w, needs_b and ctx.has_bias
    )
    return (None if grad_x is None else grad_x.to(x.dtype)), grad_w, grad_b, None


def layer_norm_grads(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    grad_y: torch.Tensor,
    eps: float,
    needs_x: bool,
    needs_w: bool,
    needs_b: bool,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """Return the gradients of y = (x - mean) * rstd * weight + bias for x, weight and bias.

    Mean and rstd are recomputed from ``x`` in float32. The x gradient stays in float32 (callers
    round it once, after adding any other gradient of x); the weight and bias gradients are in
    the weight's and x's dtype. Each is None where not needed (the weight's also without a
    weight; pass ``needs_b`` False without a bias).
    """
    # Centred about the row's first element first, as the kernels are: the mean of x itself
    # loses ~log2(n) fp32 roundings of |mean|, which on rows of mean 1000 and spread 0.1
    # biased xhat enough to put dweight 4e-4 from float64 (tests/test_backward_reference.py).
    xs = x.float()
    xs = xs - xs[..., :1]
    xc = xs - xs.mean(-1, keepdim=True)  # two-pass: exact enough for offset rows, unlike E[x^2]
    rstd = torch.rsqrt((xc * xc).mean(-1, keepdim=True) + eps)
    xhat = xc * rstd
    dy = grad_y.float()
    # Weight and bias gradients sum over every leading dim. A 1-D x has none, and sum(())
    # would reduce over all dims instead of none.
    lead = tuple(range(x.dim() - 1))
    grad_x = grad_w = grad_b = None
    if needs_x:
        g = dy if weight is None else dy * weight.float()
        grad_x = rstd * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
    if needs_w and weight is not None:
        gw = dy * xhat
        grad_w = (gw.sum(lead) if lead else gw).to(weight.dtype)
    if needs_b:
        grad_b = (dy.sum(lead) if lead else dy).to(x.dtype)
    return grad_x, grad_w, grad_b


_layer_norm_op.register_autograd(_backward, setup_context=_setup_context)

# CUDA autocast runs torch's layer_norm in float32 (its fp32 op list); do the same so a replaced
# model keeps the dtypes the original produced, compiled or not. CPU autocast has no such rule
# for layer_norm; the eager wrapper handles it (see apply_autocast).
if hasattr(torch.library, "register_autocast"):  # torch >= 2.5
    torch.library.register_autocast("autonorm::layer_norm", "cuda", torch.float32)

_OP = torch.ops.autonorm.layer_norm.default


def torch_autocasts_to_fp32(op: str) -> bool:
    """Whether this torch build's CUDA autocast runs ``op`` (e.g. ``"aten::rms_norm"``) in fp32.

    torch's fp32 op list grows between releases (rms_norm joined layer_norm there after 2.11, which
    leaves it in the input's dtype), so autonorm's ops follow the build they run on.
    """
    try:
        return bool(torch._C._dispatch_has_kernel_for_dispatch_key(op, "AutocastCUDA"))
    except (AttributeError, RuntimeError):  # a private API: assume the current rule
        return True


def apply_autocast(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    *,
    cuda_fp32: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Cast the arguments the way torch's layer_norm behaves under autocast on x's device.

    CUDA autocast runs layer_norm in float32 (its fp32 op list): cast everything to float32, as
    the op's registered autocast rule also does. CPU autocast leaves layer_norm alone, and torch's
    CPU kernel accepts float32 weights with a bfloat16 x, returning x's dtype: cast weight and bias
    to x's dtype so the output dtype matches (the parameters are rounded to it, the one numerical
    difference). Other devices: unchanged. :mod:`.rms_op` casts with this too (bias None), with
    ``cuda_fp32`` set to whether this torch build's CUDA autocast runs rms_norm in float32
    (:func:`torch_autocasts_to_fp32`); without it CUDA behaves as the CPU does.
    """
    check_optional_tensors(weight, bias)
    if x.is_cuda:
        if not _is_autocast_enabled("cuda"):
            return x, weight, bias
        if cuda_fp32:
            dtype = torch.float32
        elif x.dtype in DTYPE_NAMES:
            dtype = x.dtype  # an op autocast leaves alone: the parameters follow x, as on the CPU
        else:
            return x, weight, bias
    elif x.device.type == "cpu" and _is_autocast_enabled("cpu") and x.dtype in DTYPE_NAMES:
        dtype = x.dtype
    else:
        return x, weight, bias

    def cast(t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None or not t.is_floating_point() or t.dtype == dtype:
            return t
        return t.to(dtype)

    return cast(x), cast(weight), cast(bias)


def layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """Normalize the last dimension of ``x`` with the autonorm kernel (zero copy).

    ``y = (x - mean) / sqrt(var + eps) * weight + bias`` over the last dimension, like
    ``torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps)``.

    On CUDA the kernel reads ``x`` in place and writes a new tensor allocated by torch, on torch's
    current stream of ``x``'s device. Non-contiguous inputs are made contiguous first (one copy),
    and so are inputs whose data pointer is not 16-byte aligned (a slice at an odd offset); the
    output is always contiguous. Tensors on other devices (CPU) are computed with
    ``torch.nn.functional.layer_norm``. Under CUDA autocast the computation runs in float32, as
    torch's own layer_norm does (under CPU autocast, weight and bias follow x's dtype). Gradients
    flow to x, weight and bias; ``torch.compile`` sees the custom op
    ``torch.ops.autonorm.layer_norm`` without a graph break.

    The first call for a new (device, dtype, hidden size, affine flags, row-count bucket) looks
    the kernel up in the tuning database and compiles it; do that before capturing a CUDA graph.

    Args:
        x: input of shape (..., hidden); float32, float16 or bfloat16.
        weight: optional scale of shape (hidden,), same dtype and device as x.
        bias: optional shift of shape (hidden,), same dtype and device as x.
        eps: added to the variance; must be > 0.

    Returns:
        A new contiguous tensor of x's shape, dtype and device.

    Raises:
        autonorm.errors.InputError: x, weight or bias is not a tensor (weight and bias may be
            None), or eps <= 0.
        autonorm.errors.UnsupportedDtypeError: a dtype is unsupported, or the dtypes differ.
        autonorm.errors.ShapeError: x is 0-d, or weight/bias is not (hidden,).
        autonorm.errors.DeviceMismatchError: weight or bias is on another device than x.

    """
    if _is_compiling():
        check_optional_tensors(weight, bias)
        return _OP(x, weight, bias, eps)
    if type(x) is not _Tensor or dispatch_modes():
        # Subclasses (Parameter, FakeTensor, DTensor) and dispatch modes go through the op.
        if not isinstance(x, torch.Tensor):
            raise InputError(f"x must be a torch.Tensor, got {type(x).__name__}")
        check_optional_tensors(weight, bias)
        if any_autocast():
            x, weight, bias = apply_autocast(x, weight, bias)
        return _OP(x, weight, bias, as_float(eps))
    if any_autocast():
        x, weight, bias = apply_autocast(x, weight, bias)
    try:
        needs_grad = _is_grad_enabled() and (
            x.requires_grad
            or (weight is not None and weight.requires_grad)
            or (bias is not None and bias.requires_grad)
        )
    except AttributeError:  # a parameter that is no tensor: name it, not what it lacks
        check_optional_tensors(weight, bias)
        raise
    if needs_grad:
        check_optional_tensors(weight, bias)  # x's requires_grad may have read neither
        return _OP(x, weight, bias, as_float(eps))
    if x.is_cuda:
        return forward_cuda(x, weight, bias, eps)
    return forward_reference(x, weight, bias, eps)
