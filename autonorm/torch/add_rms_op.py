"""The residual add + RMSNorm custom ops and the public :func:`add_rms_norm`.

``torch.ops.autonorm.add_rms_norm`` is functional (returns new ``y`` and ``h``), with a fake
implementation for tracing, autograd (on CUDA one launch of the backward kernel, the returned
h's gradient added to dx there; elsewhere a formula in PyTorch ops) and an autocast rule.
``torch.ops.autonorm.fused_add_rms_norm_`` is vLLM's ``fused_add_rms_norm`` (``residual``
becomes ``h``, ``x`` becomes ``y``) for inference engines: it declares both mutations, so
``torch.compile`` functionalizes it without a graph break, and has no gradient.
:func:`add_rms_norm` goes through an op only where tracing, autograd or a dispatch mode needs
it; eager inference goes straight to :func:`autonorm.torch.residual_forward.forward_add_rms_cuda`.
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
from autonorm.torch.checks import check_flag, check_weight_offset, validate_add_rms
from autonorm.torch.residual_forward import (
    add_in_place_reference,
    forward_add_rms_cuda,
    forward_add_rms_reference,
)
from autonorm.torch.rms_op import CUDA_FP32, DEFAULT_EPS, rms_norm_grads

__all__ = ["add_rms_norm"]


@torch.library.custom_op(
    "autonorm::add_rms_norm",
    mutates_args=(),
    schema=(
        "(Tensor x, Tensor residual, Tensor? weight, float eps, bool weight_offset) "
        "-> (Tensor, Tensor)"
    ),
)
def _add_rms_norm_op(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    weight_offset: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    if x.is_cuda:
        return forward_add_rms_cuda(x, residual, weight, eps, weight_offset)
    return forward_add_rms_reference(x, residual, weight, eps, weight_offset)


@_add_rms_norm_op.register_fake
def _add_rms_norm_fake(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    weight_offset: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    # Validating here makes torch.compile report bad inputs at trace time, as eager would.
    # h has the residual's dtype: x's, or float32 beside a 16-bit x.
    validate_add_rms(x, residual, weight, eps, weight_offset)
    contiguous = torch.contiguous_format
    return torch.empty_like(x, memory_format=contiguous), torch.empty_like(
        residual, memory_format=contiguous
    )


def _setup_context(ctx: object, inputs: tuple, output: tuple) -> None:
    _, _, weight, eps, weight_offset = inputs
    # h is an output anyway: saving it costs no memory, and the statistics are recomputed from
    # it in backward (the norm's input is exactly h).
    ctx.save_for_backward(output[1], weight)
    ctx.x_dtype = inputs[0].dtype  # h's, or 16-bit beside a float32 residual and h
    ctx.eps = eps
    ctx.weight_offset = weight_offset


def _backward(ctx: object, grad_y: torch.Tensor | None, grad_h: torch.Tensor | None) -> tuple:
    """Gradients of (y, h): x and residual both see grad_h + the norm's gradient through h."""
    h, weight = ctx.saved_tensors
    needs_x, needs_r, needs_w = ctx.needs_input_grad[:3]
    # The backward kernel takes h in x's dtype: a float32 h beside 16-bit x takes torch's ops.
    if ctx.x_dtype == h.dtype and kernel_serves(h, grad_y, grad_h, needs_x or needs_r):
        # One launch: the norm's gradient with grad_h added, and the weight's column sum.
        grad, dw, _ = backward_op.norm_backward(grad_y, h, weight, rms=True,
                                                weight_offset=ctx.weight_offset, eps=ctx.eps,
                                                dh=grad_h)
        return (*split_sum_grad(grad, needs_x, needs_r), dw if needs_w else None, None, None)
    grads = add_backward(
        h, grad_y, grad_h, needs_x, needs_r,
        lambda g, needs_h: rms_norm_grads(
            h, weight, g, ctx.eps, ctx.weight_offset, needs_h, needs_w
        ),
        ctx.x_dtype,
    )
    return (*grads, None, None)


_add_rms_norm_op.register_autograd(_backward, setup_context=_setup_context)

# Where this torch build's CUDA autocast runs rms_norm in float32, so does this op, y and h alike
# (the sum of a float32 residual stream and a lower-precision x promotes to float32 in torch too).
if CUDA_FP32 and hasattr(torch.library, "register_autocast"):  # torch >= 2.5
    torch.library.register_autocast("autonorm::add_rms_norm", "cuda", torch.float32)


@torch.library.custom_op(
    "autonorm::fused_add_rms_norm_",
    mutates_args=("x", "residual"),
    schema=(
        "(Tensor(a!) x, Tensor(b!) residual, Tensor? weight, float eps, bool weight_offset) -> ()"
    ),
)
def _fused_add_rms_norm_op(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    weight_offset: bool,
) -> None:
    if x.is_cuda:
        forward_add_rms_cuda(x, residual, weight, eps, weight_offset, True)
    else:
        add_in_place_reference(
            forward_add_rms_reference, x, residual, weight, eps, weight_offset
        )


@_fused_add_rms_norm_op.register_fake
def _fused_add_rms_norm_fake(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    weight_offset: bool,
) -> None:
    validate_add_rms(x, residual, weight, eps, weight_offset)


_ROUTE = AddNorm(
    torch.ops.autonorm.add_rms_norm.default,
    torch.ops.autonorm.fused_add_rms_norm_.default,
    forward_add_rms_cuda,
    forward_add_rms_reference,
    has_bias=False,
    cuda_fp32=CUDA_FP32,
)


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float | None = None,
    weight_offset: bool = False,
    in_place: bool = False,
    *,
    residual_dtype: torch.dtype | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Add ``residual`` to ``x`` and RMSNorm the sum with the autonorm kernel: ``(y, h)``.

    ``h = x + residual``, summed in float32 and rounded once to h's dtype, and
    ``y = h / sqrt(mean(h^2) + eps) * w`` over the last dimension, the norm of exactly that
    ``h`` in x's dtype (``w`` the weight, ``1 + weight`` where ``weight_offset``, or one). This
    is ``h = x + residual; y = torch.nn.functional.rms_norm(h, (hidden,), weight, eps)`` in one
    pass, Liger's ``LigerFusedAddRMSNorm`` as a function.

    h's dtype is ``residual_dtype`` if given, else the residual's. A mixed-precision residual
    stream keeps the residual and h in float32 beside a 16-bit x: h is then the float32 sum
    ``x.float() + residual``, not rounded to 16 bits, and y its norm rounded to x's dtype. A
    16-bit residual with ``residual_dtype=torch.float32`` is converted to float32 first, an
    extra pass over it (in torch's ops, so gradients and ``torch.compile`` see it); a float32
    residual always gives a float32 h.

    With ``in_place``, vLLM's ``fused_add_rms_norm``: ``residual`` becomes ``h`` and ``x``
    becomes ``y``, and ``(x, residual)`` are returned; no memory is allocated where both are
    contiguous and 16-byte aligned (others are computed out of place and copied back), so the
    call can be captured in a CUDA graph. The in-place form has no gradient: it refuses tensors
    that require one while grad mode is on (run it under ``torch.no_grad()`` or
    ``torch.inference_mode()``). Functional and in-place results are the same bits.

    On CUDA the kernel runs on torch's current stream of x's device; tensors on other devices
    are computed with torch's ops, with the same rounding of the sum. Under CUDA autocast the
    functional form runs in float32, as torch's rms_norm does (y and h in float32). Gradients
    of the functional form flow to x, residual (the same gradient: ``grad_h`` plus the norm's,
    each in its input's dtype) and weight; ``torch.compile`` sees
    ``torch.ops.autonorm.add_rms_norm`` (or ``fused_add_rms_norm_``) without a graph break.
    With a float32 h beside 16-bit x the backward is computed with torch's ops, not the
    backward kernel.

    The first call for a new (device, dtype, hidden size, weight form, row-count bucket) looks
    the kernel up in the tuning database and compiles it; do that before capturing a CUDA graph.

    Args:
        x: input of shape (..., hidden); float32, float16 or bfloat16.
        residual: the residual stream, x's shape and device; x's dtype, or float32 beside a
            16-bit x.
        weight: optional scale of shape (hidden,), same dtype and device as x.
        eps: added to the mean of squares; must be > 0. None takes torch's default, float32's
            machine epsilon (:data:`autonorm.torch.rms_op.DEFAULT_EPS`).
        weight_offset: scale by ``1 + weight`` instead of ``weight`` (needs a weight).
        in_place: write y into x and h into residual (separate tensors) and return them; h's
            dtype must then be the residual's.
        residual_dtype: keyword only; h's dtype, x's or float32 (a torch dtype or a name such
            as ``"fp32"``); None takes the residual's.

    Returns:
        ``(y, h)``: new contiguous tensors of x's shape and device, y in x's dtype and h in
        h's, or ``(x, residual)`` with ``in_place``.

    Raises:
        autonorm.errors.InputError: x or residual is not a tensor, eps <= 0, weight_offset or
            in_place is no bool, weight_offset has no weight, residual_dtype is neither x's
            dtype nor float32 (or 16-bit beside a float32 residual, or in place not the
            residual's), or (in place) x and residual share memory or need a gradient.
        autonorm.errors.UnsupportedDtypeError: a dtype is unsupported, or the residual's is
            neither x's nor float32 beside a 16-bit x, or the weight's is not x's.
        autonorm.errors.ShapeError: x is 0-d, residual is not x's shape, or weight not (hidden,).
        autonorm.errors.DeviceMismatchError: residual or weight is on another device than x.

    """
    if eps is None:
        eps = DEFAULT_EPS
    # Checked here for every path: the ops' schemas would reject a non-bool with a TypeError.
    check_weight_offset(weight_offset, weight)
    if in_place is not False:
        check_flag(in_place, "in_place")
    if residual_dtype is not None:
        residual = residual_for(x, residual, residual_dtype, in_place)
    if in_place:
        return _ROUTE.in_place(x, residual, weight, None, eps, (weight_offset,))
    return _ROUTE.functional(x, residual, weight, None, eps, (weight_offset,))
