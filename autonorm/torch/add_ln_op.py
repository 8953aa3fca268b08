"""The residual add + LayerNorm custom ops and the public :func:`add_layer_norm`.

``torch.ops.autonorm.add_layer_norm`` is functional (returns new ``y`` and ``h``), with a fake
implementation for tracing, autograd (on CUDA one launch of the backward kernel, the returned
h's gradient added to dx there; elsewhere LayerNorm's formula in PyTorch ops, from
:mod:`.custom_op`) and an autocast rule. ``torch.ops.autonorm.fused_add_layer_norm_`` is the
in-place form with vLLM's semantics (``residual`` becomes ``h``, ``x`` becomes ``y``): it
declares both mutations, so ``torch.compile`` functionalizes it without a graph break, and has
no gradient. :func:`add_layer_norm` routes calls as :func:`autonorm.torch.add_rms_norm` does
(:class:`autonorm.torch.add_route.AddNorm`); eager inference goes straight to
:func:`autonorm.torch.residual_forward.forward_add_ln_cuda`.
"""

from __future__ import annotations

import torch

from autonorm.torch import backward_op
from autonorm.torch.add_route import (
    AddNorm,
    add_backward,
    kernel_serves,
    residual_for,
    split_sum_grad,
)
from autonorm.torch.checks import check_flag, validate_add_ln
from autonorm.torch.custom_op import layer_norm_grads
from autonorm.torch.residual_forward import (
    add_in_place_reference,
    forward_add_ln_cuda,
    forward_add_ln_reference,
)

__all__ = ["add_layer_norm"]


@torch.library.custom_op(
    "autonorm::add_layer_norm",
    mutates_args=(),
    schema=(
        "(Tensor x, Tensor residual, Tensor? weight, Tensor? bias, float eps) -> (Tensor, Tensor)"
    ),
)
def _add_layer_norm_op(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    if x.is_cuda:
        return forward_add_ln_cuda(x, residual, weight, bias, eps)
    return forward_add_ln_reference(x, residual, weight, bias, eps)


@_add_layer_norm_op.register_fake
def _add_layer_norm_fake(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    # Validating here makes torch.compile report bad inputs at trace time, as eager would.
    # h has the residual's dtype: x's, or float32 beside a 16-bit x.
    validate_add_ln(x, residual, weight, bias, eps)
    contiguous = torch.contiguous_format
    return torch.empty_like(x, memory_format=contiguous), torch.empty_like(
        residual, memory_format=contiguous
    )


def _setup_context(ctx: object, inputs: tuple, output: tuple) -> None:
    _, _, weight, bias, eps = inputs
    # h is an output anyway: saving it costs no memory, and mean and rstd are recomputed from
    # it in backward (the norm's input is exactly h).
    ctx.save_for_backward(output[1], weight)
    ctx.x_dtype = inputs[0].dtype  # h's, or 16-bit beside a float32 residual and h
    ctx.eps = eps
    ctx.has_bias = bias is not None


def _backward(ctx: object, grad_y: torch.Tensor | None, grad_h: torch.Tensor | None) -> tuple:
    """Gradients of (y, h): x and residual both see grad_h + the norm's gradient through h."""
    h, weight = ctx.saved_tensors
    needs_x, needs_r, needs_w, needs_b = ctx.needs_input_grad[:4]
    # The backward kernel takes h in x's dtype: a float32 h beside 16-bit x takes torch's ops.
    if ctx.x_dtype == h.dtype and kernel_serves(h, grad_y, grad_h, needs_x or needs_r):
        # One launch: the norm's gradient with grad_h added, and the column sums.
        grad, dw, db = backward_op.norm_backward(grad_y, h, weight, rms=False,
                                                 has_bias=ctx.has_bias, eps=ctx.eps, dh=grad_h)
        return (*split_sum_grad(grad, needs_x, needs_r), dw if needs_w else None,
                db if needs_b else None, None)
    grads = add_backward(
        h, grad_y, grad_h, needs_x, needs_r,
        lambda g, needs_h: layer_norm_grads(
            h, weight, g, ctx.eps, needs_h, needs_w, needs_b and ctx.has_bias
        ),
        ctx.x_dtype,
    )
    grad_x, grad_r, grad_w, grad_b = grads
    if grad_b is not None:
        grad_b = grad_b.to(ctx.x_dtype)  # the bias has x's dtype; the formula gives h's
    return grad_x, grad_r, grad_w, grad_b, None


_add_layer_norm_op.register_autograd(_backward, setup_context=_setup_context)

# CUDA autocast runs torch's layer_norm in float32 (its fp32 op list): so does this op, y and h
# alike (the sum of a float32 residual stream and a lower-precision x promotes to float32 in
# torch too).
if hasattr(torch.library, "register_autocast"):  # torch >= 2.5
    torch.library.register_autocast("autonorm::add_layer_norm", "cuda", torch.float32)


@torch.library.custom_op(
    "autonorm::fused_add_layer_norm_",
    mutates_args=("x", "residual"),
    schema=(
        "(Tensor(a!) x, Tensor(b!) residual, Tensor? weight, Tensor? bias, float eps) -> ()"
    ),
)
def _fused_add_layer_norm_op(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
) -> None:
    if x.is_cuda:
        forward_add_ln_cuda(x, residual, weight, bias, eps, True)
    else:
        add_in_place_reference(forward_add_ln_reference, x, residual, weight, bias, eps)


@_fused_add_layer_norm_op.register_fake
def _fused_add_layer_norm_fake(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
) -> None:
    validate_add_ln(x, residual, weight, bias, eps)


_ROUTE = AddNorm(
    torch.ops.autonorm.add_layer_norm.default,
    torch.ops.autonorm.fused_add_layer_norm_.default,
    forward_add_ln_cuda,
    forward_add_ln_reference,
    has_bias=True,
    cuda_fp32=True,  # layer_norm is on CUDA autocast's fp32 list in every torch build
)


def add_layer_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    in_place: bool = False,
    residual_dtype: torch.dtype | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Add ``residual`` to ``x`` and LayerNorm the sum with the autonorm kernel: ``(y, h)``.

    ``h = x + residual``, summed in float32 and rounded once to h's dtype, and
    ``y = (h - mean) / sqrt(var + eps) * weight + bias`` over the last dimension, the norm of
    exactly that ``h`` in x's dtype. This is ``h = x + residual; y =
    torch.nn.functional.layer_norm(h, (hidden,), weight, bias, eps)`` in one pass.

    h's dtype is ``residual_dtype`` if given, else the residual's. A mixed-precision residual
    stream keeps the residual and h in float32 beside a 16-bit x: h is then the float32 sum
    ``x.float() + residual``, not rounded to 16 bits, and y its norm rounded to x's dtype. A
    16-bit residual with ``residual_dtype=torch.float32`` is converted to float32 first, an
    extra pass over it (in torch's ops, so gradients and ``torch.compile`` see it); a float32
    residual always gives a float32 h.

    With ``in_place``, vLLM's semantics: ``residual`` becomes ``h`` and ``x`` becomes ``y``, and
    ``(x, residual)`` are returned; no memory is allocated where both are contiguous and 16-byte
    aligned (others are computed out of place and copied back), so the call can be captured in a
    CUDA graph. The in-place form has no gradient: it refuses tensors that require one while
    grad mode is on (run it under ``torch.no_grad()`` or ``torch.inference_mode()``). Functional
    and in-place results are the same bits.

    On CUDA the kernel runs on torch's current stream of x's device; tensors on other devices
    are computed with torch's ops (``torch.nn.functional.layer_norm`` of the rounded sum).
    Under CUDA autocast the functional form runs in float32, as torch's layer_norm does (y and
    h in float32); under CPU autocast weight and bias follow x's dtype. Gradients of the
    functional form flow to x, residual (the same gradient: ``grad_h`` plus the norm's, each in
    its input's dtype), weight and bias; ``torch.compile`` sees
    ``torch.ops.autonorm.add_layer_norm`` (or ``fused_add_layer_norm_``) without a graph break.
    With a float32 h beside 16-bit x the backward is computed with torch's ops, not the
    backward kernel.

    The first call for a new (device, dtype, hidden size, affine flags, row-count bucket) looks
    the kernel up in the tuning database and compiles it; do that before capturing a CUDA graph.

    Args:
        x: input of shape (..., hidden); float32, float16 or bfloat16.
        residual: the residual stream, x's shape and device; x's dtype, or float32 beside a
            16-bit x.
        weight: optional scale of shape (hidden,), same dtype and device as x.
        bias: optional shift of shape (hidden,), same dtype and device as x.
        eps: added to the variance; must be > 0.
        in_place: keyword only; write y into x and h into residual (separate tensors) and
            return them; h's dtype must then be the residual's.
        residual_dtype: keyword only; h's dtype, x's or float32 (a torch dtype or a name such
            as ``"fp32"``); None takes the residual's.

    Returns:
        ``(y, h)``: new contiguous tensors of x's shape and device, y in x's dtype and h in
        h's, or ``(x, residual)`` with ``in_place``.

    Raises:
        autonorm.errors.InputError: x or residual is not a tensor, eps <= 0, in_place is no
            bool, residual_dtype is neither x's dtype nor float32 (or 16-bit beside a float32
            residual, or in place not the residual's), or (in place) x and residual share
            memory or need a gradient.
        autonorm.errors.UnsupportedDtypeError: a dtype is unsupported, or the residual's is
            neither x's nor float32 beside a 16-bit x, or the weight's or bias's is not x's.
        autonorm.errors.ShapeError: x is 0-d, residual is not x's shape, or weight or bias is
            not (hidden,).
        autonorm.errors.DeviceMismatchError: residual, weight or bias is on another device than
            x.

    """
    if in_place is not False:
        check_flag(in_place, "in_place")
    if residual_dtype is not None:
        residual = residual_for(x, residual, residual_dtype, in_place)
    if in_place:
        return _ROUTE.in_place(x, residual, weight, bias, eps)
    return _ROUTE.functional(x, residual, weight, bias, eps)
