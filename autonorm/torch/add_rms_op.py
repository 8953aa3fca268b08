"""The residual add + RMSNorm custom ops and the public :func:`add_rms_norm`.

``torch.ops.autonorm.add_rms_norm`` is functional (returns new ``y`` and ``h``), with a fake
implementation for tracing, an autograd formula in PyTorch ops and an autocast rule.
``torch.ops.autonorm.fused_add_rms_norm_`` is vLLM's ``fused_add_rms_norm`` (``residual``
becomes ``h``, ``x`` becomes ``y``) for inference engines: it declares both mutations, so
``torch.compile`` functionalizes it without a graph break, and has no gradient.
:func:`add_rms_norm` goes through an op only where tracing, autograd or a dispatch mode needs
it; eager inference goes straight to :func:`autonorm.torch.residual_forward.forward_add_rms_cuda`.
"""

from __future__ import annotations

import torch

from autonorm.errors import InputError
from autonorm.torch.checks import as_float, check_flag, check_weight_offset, validate_add_rms
from autonorm.torch.custom_op import any_autocast, apply_autocast, dispatch_modes
from autonorm.torch.residual_forward import (
    check_disjoint,
    forward_add_rms_cuda,
    forward_add_rms_reference,
)
from autonorm.torch.rms_op import CUDA_FP32, DEFAULT_EPS, rms_norm_grads

__all__ = ["add_rms_norm"]

_Tensor = torch.Tensor
_is_compiling = torch.compiler.is_compiling
_is_grad_enabled = torch.is_grad_enabled
_increment_version = torch.autograd.graph.increment_version


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
    validate_add_rms(x, residual, weight, eps, weight_offset)
    contiguous = torch.contiguous_format
    return torch.empty_like(x, memory_format=contiguous), torch.empty_like(
        x, memory_format=contiguous
    )


def _setup_context(ctx: object, inputs: tuple, output: tuple) -> None:
    _, _, weight, eps, weight_offset = inputs
    # h is an output anyway: saving it costs no memory, and the statistics are recomputed from
    # it in backward (the norm's input is exactly h).
    ctx.save_for_backward(output[1], weight)
    ctx.eps = eps
    ctx.weight_offset = weight_offset


def _backward(ctx: object, grad_y: torch.Tensor | None, grad_h: torch.Tensor | None) -> tuple:
    """Gradients of (y, h): h = x + residual feeds y, so both see grad_h + the norm's gradient.

    The rounding of the sum to the dtype passes gradients straight through, as torch's add does.
    """
    h, weight = ctx.saved_tensors
    needs_x, needs_r, needs_w = ctx.needs_input_grad[:3]
    needs_h = needs_x or needs_r
    if grad_y is None:  # only where autograd does not materialize unused outputs' gradients
        grad_y = torch.zeros_like(h)
    grad_hf, grad_w = rms_norm_grads(
        h, weight, grad_y, ctx.eps, ctx.weight_offset, needs_h, needs_w
    )
    grad_x = grad_r = None
    if needs_h:
        if grad_h is not None:
            grad_hf = grad_hf + grad_h.float()
        grad = grad_hf.to(h.dtype)
        grad_x = grad if needs_x else None
        # A tensor of its own: a gradient accumulated into x.grad must not show in residual's.
        grad_r = (grad.clone() if needs_x else grad) if needs_r else None
    return grad_x, grad_r, grad_w, None, None


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
        _add_rms_norm_in_place_reference(x, residual, weight, eps, weight_offset)


@_fused_add_rms_norm_op.register_fake
def _fused_add_rms_norm_fake(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    weight_offset: bool,
) -> None:
    validate_add_rms(x, residual, weight, eps, weight_offset)


def _add_rms_norm_in_place_reference(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    weight_offset: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The in-place form with torch's ops: both results first, then both copies."""
    validate_add_rms(x, residual, weight, eps, weight_offset)
    check_disjoint(x, residual)
    y, h = forward_add_rms_reference(x, residual, weight, eps, weight_offset)
    x.copy_(y)
    residual.copy_(h)
    return x, residual


_OP = torch.ops.autonorm.add_rms_norm.default
_IN_PLACE_OP = torch.ops.autonorm.fused_add_rms_norm_.default


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float | None = None,
    weight_offset: bool = False,
    in_place: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Add ``residual`` to ``x`` and RMSNorm the sum with the autonorm kernel: ``(y, h)``.

    ``h = x + residual``, summed in float32 and rounded once to x's dtype, and
    ``y = h / sqrt(mean(h^2) + eps) * w`` over the last dimension, the norm of exactly that
    ``h`` (``w`` the weight, ``1 + weight`` where ``weight_offset``, or one). This is
    ``h = x + residual; y = torch.nn.functional.rms_norm(h, (hidden,), weight, eps)`` in one
    pass, Liger's ``LigerFusedAddRMSNorm`` as a function.

    With ``in_place``, vLLM's ``fused_add_rms_norm``: ``residual`` becomes ``h`` and ``x``
    becomes ``y``, and ``(x, residual)`` are returned; no memory is allocated where both are
    contiguous and 16-byte aligned (others are computed out of place and copied back), so the
    call can be captured in a CUDA graph. The in-place form has no gradient: it refuses tensors
    that require one while grad mode is on (run it under ``torch.no_grad()`` or
    ``torch.inference_mode()``). Functional and in-place results are the same bits.

    On CUDA the kernel runs on torch's current stream of x's device; tensors on other devices
    are computed with torch's ops, with the same rounding of the sum. Under CUDA autocast the
    functional form runs in float32, as torch's rms_norm does (y and h in float32). Gradients
    of the functional form flow to x, residual (the same gradient: ``grad_h`` plus the norm's)
    and weight; ``torch.compile`` sees ``torch.ops.autonorm.add_rms_norm`` (or
    ``fused_add_rms_norm_``) without a graph break.

    The first call for a new (device, dtype, hidden size, weight form, row-count bucket) looks
    the kernel up in the tuning database and compiles it; do that before capturing a CUDA graph.

    Args:
        x: input of shape (..., hidden); float32, float16 or bfloat16.
        residual: the residual stream, x's shape, dtype and device.
        weight: optional scale of shape (hidden,), same dtype and device as x.
        eps: added to the mean of squares; must be > 0. None takes torch's default, float32's
            machine epsilon (:data:`autonorm.torch.rms_op.DEFAULT_EPS`).
        weight_offset: scale by ``1 + weight`` instead of ``weight`` (needs a weight).
        in_place: write y into x and h into residual (separate tensors) and return them.

    Returns:
        ``(y, h)``: new contiguous tensors of x's shape, dtype and device, or ``(x, residual)``
        with ``in_place``.

    Raises:
        autonorm.errors.InputError: x or residual is not a tensor, eps <= 0, weight_offset or
            in_place is no bool, weight_offset has no weight, or (in place) x and residual
            share memory or need a gradient.
        autonorm.errors.UnsupportedDtypeError: a dtype is unsupported, or the dtypes differ.
        autonorm.errors.ShapeError: x is 0-d, residual is not x's shape, or weight not (hidden,).
        autonorm.errors.DeviceMismatchError: residual or weight is on another device than x.

    """
    if eps is None:
        eps = DEFAULT_EPS
    if in_place is not False:
        check_flag(in_place, "in_place")
        return _add_rms_norm_in_place(x, residual, weight, eps, weight_offset)
    if _is_compiling():
        check_weight_offset(weight_offset, weight)
        return _OP(x, residual, weight, as_float(eps), weight_offset)
    if type(x) is not _Tensor or type(residual) is not _Tensor or dispatch_modes():
        # Subclasses (Parameter, FakeTensor, DTensor) and dispatch modes go through the op.
        _check_tensors(x, residual)
        check_weight_offset(weight_offset, weight)
        if any_autocast():
            x, residual, weight = _autocast(x, residual, weight)
        return _OP(x, residual, weight, as_float(eps), weight_offset)
    if any_autocast():
        x, residual, weight = _autocast(x, residual, weight)
    if _is_grad_enabled() and (
        x.requires_grad
        or residual.requires_grad
        or (weight is not None and weight.requires_grad)
    ):
        check_weight_offset(weight_offset, weight)
        return _OP(x, residual, weight, as_float(eps), weight_offset)
    if x.is_cuda:
        return forward_add_rms_cuda(x, residual, weight, eps, weight_offset)
    return forward_add_rms_reference(x, residual, weight, eps, weight_offset)


def _add_rms_norm_in_place(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    weight_offset: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The in-place form of :func:`add_rms_norm`: y into x, h into residual."""
    _check_tensors(x, residual)
    check_weight_offset(weight_offset, weight)
    if _is_grad_enabled() and (
        x.requires_grad
        or residual.requires_grad
        or (isinstance(weight, torch.Tensor) and weight.requires_grad)
    ):
        raise InputError(
            "in_place=True has no gradient: x, residual and weight must not require grad "
            "(use the functional form, or torch.no_grad() / torch.inference_mode())"
        )
    if (
        _is_compiling()
        or type(x) is not _Tensor
        or type(residual) is not _Tensor
        or dispatch_modes()
    ):
        _IN_PLACE_OP(x, residual, weight, as_float(eps), weight_offset)
        return x, residual
    if x.is_cuda:
        forward_add_rms_cuda(x, residual, weight, eps, weight_offset, True)
        # The kernel writes behind autograd's back: bump the version counters, so a graph that
        # saved x or residual refuses to run backward on the new values (no-op in inference).
        _increment_version((x, residual))
        return x, residual
    return _add_rms_norm_in_place_reference(x, residual, weight, eps, weight_offset)


def _check_tensors(x: object, residual: object) -> None:
    """Raise InputError naming x or residual where one is no tensor (before an op's schema)."""
    for name, t in (("x", x), ("residual", residual)):
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def _autocast(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Cast as torch's add and rms_norm behave under autocast on x's device.

    CUDA: everything to float32 where this torch build runs rms_norm in float32 (the op's
    registered rule does the same), else x and the residual to their promoted dtype and the
    weight to it.
    CPU: the weight follows x's dtype, as for rms_norm; the residual is left as it is.
    """
    if x.is_cuda and CUDA_FP32:
        x, weight, residual = apply_autocast(x, weight, residual)
    elif x.is_cuda:
        # torch's add promotes x and the residual; its rms_norm then keeps h's dtype and takes
        # the weight as it is: the weight follows h here, which gives h's dtype out too.
        if x.dtype != residual.dtype and x.is_floating_point() and residual.is_floating_point():
            common = torch.promote_types(x.dtype, residual.dtype)
            x, residual = x.to(common), residual.to(common)
        x, weight, _ = apply_autocast(x, weight, None, cuda_fp32=False)
    else:
        x, weight, _ = apply_autocast(x, weight, None)
    return x, residual, weight
