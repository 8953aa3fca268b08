"""What the residual add + norm ops share: call routing, the in-place form, autocast, backward.

:func:`autonorm.torch.add_rms_norm` and :func:`autonorm.torch.add_layer_norm` differ in their
ops and forwards, not in how a call reaches them. An :class:`AddNorm` holds one norm's ops and
forwards and routes calls to them: through the functional op where tracing, autograd, a tensor
subclass or a dispatch mode needs it, straight to the CUDA forward in eager inference; the
in-place form refuses gradients, bumps version counters after a kernel writes behind autograd's
back, and checks that x and residual do not overlap (in the forwards). :func:`add_backward` turns
a norm's gradients into those of x and residual. :func:`residual_for` applies ``residual_dtype``
before the ops: the residual tensor's dtype is h's inside them, so their schemas need no dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from autonorm.errors import InputError
from autonorm.residual_dtype import resolve_h_dtype
from autonorm.torch.checks import (
    DTYPE_NAMES,
    as_float,
    check_optional_tensors,
    check_residual,
    check_tensors,
)
from autonorm.torch.custom_op import any_autocast, apply_autocast, dispatch_modes
from autonorm.torch.residual_forward import add_in_place_reference

__all__ = [
    "AddNorm",
    "add_backward",
    "autocast_add",
    "kernel_serves",
    "residual_for",
    "split_sum_grad",
]

_Tensor = torch.Tensor
_is_compiling = torch.compiler.is_compiling
_is_grad_enabled = torch.is_grad_enabled
_increment_version = torch.autograd.graph.increment_version


class AddNorm:
    """One residual add + norm as its public function routes it.

    The ops and forwards all take ``(x, residual, weight, [bias,] eps, *rest)``: a bias only
    where ``has_bias`` (LayerNorm), and ``rest`` the norm's own trailing arguments (RMSNorm's
    weight_offset). The CUDA forward takes one more, ``in_place``.

    Args:
        op: the functional op, returning ``(y, h)``.
        in_place_op: the in-place op (mutates x and residual, returns nothing).
        cuda: the CUDA forward (:mod:`.residual_forward`).
        reference: the forward with torch's ops, for every other device.
        has_bias: whether the ops take a bias after the weight.
        cuda_fp32: whether CUDA autocast runs the norm in float32 in this torch build.

    """

    __slots__ = ("cuda", "cuda_fp32", "has_bias", "in_place_op", "op", "reference")

    def __init__(
        self,
        op: Callable[..., Any],
        in_place_op: Callable[..., Any],
        cuda: Callable[..., tuple[torch.Tensor, torch.Tensor]],
        reference: Callable[..., tuple[torch.Tensor, torch.Tensor]],
        *,
        has_bias: bool,
        cuda_fp32: bool,
    ) -> None:
        self.op = op
        self.in_place_op = in_place_op
        self.cuda = cuda
        self.reference = reference
        self.has_bias = has_bias
        self.cuda_fp32 = cuda_fp32

    def _args(self, weight: object, bias: object, eps: object, rest: tuple) -> tuple:
        """The arguments after (x, residual), in the ops' order."""
        return (weight, bias, eps, *rest) if self.has_bias else (weight, eps, *rest)

    def functional(
        self,
        x: torch.Tensor,
        residual: torch.Tensor,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        eps: float,
        rest: tuple = (),
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(y, h)``, through the op only where tracing, autograd or dispatch needs it."""
        if _is_compiling():
            check_optional_tensors(weight, bias)
            return self.op(x, residual, *self._args(weight, bias, as_float(eps), rest))
        if type(x) is not _Tensor or type(residual) is not _Tensor or dispatch_modes():
            # Subclasses (Parameter, FakeTensor, DTensor) and dispatch modes go through the op.
            check_tensors(x, residual)
            check_optional_tensors(weight, bias)
            if any_autocast():
                x, residual, weight, bias = autocast_add(
                    x, residual, weight, bias, self.cuda_fp32
                )
            return self.op(x, residual, *self._args(weight, bias, as_float(eps), rest))
        if any_autocast():
            x, residual, weight, bias = autocast_add(x, residual, weight, bias, self.cuda_fp32)
        if _needs_grad(x, residual, weight, bias):
            check_optional_tensors(weight, bias)
            return self.op(x, residual, *self._args(weight, bias, as_float(eps), rest))
        if x.is_cuda:
            return self.cuda(x, residual, *self._args(weight, bias, eps, rest))
        return self.reference(x, residual, *self._args(weight, bias, eps, rest))

    def in_place(
        self,
        x: torch.Tensor,
        residual: torch.Tensor,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        eps: float,
        rest: tuple = (),
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write y into x and h into residual and return them; no gradient."""
        check_tensors(x, residual)
        check_optional_tensors(weight, bias)
        if _needs_grad(x, residual, weight, bias):
            params = "weight and bias" if self.has_bias else "weight"
            raise InputError(
                f"in_place=True has no gradient: x, residual and {params} must not require grad "
                "(use the functional form, or torch.no_grad() / torch.inference_mode())"
            )
        args = self._args(weight, bias, as_float(eps), rest)
        if (
            _is_compiling()
            or type(x) is not _Tensor
            or type(residual) is not _Tensor
            or dispatch_modes()
        ):
            self.in_place_op(x, residual, *args)
            return x, residual
        if x.is_cuda:
            self.cuda(x, residual, *args, True)
            # The kernel writes behind autograd's back: bump the version counters, so a graph
            # that saved x or residual refuses to run backward on the new values (no-op in
            # inference).
            _increment_version((x, residual))
            return x, residual
        return add_in_place_reference(self.reference, x, residual, *args)


def _needs_grad(x: torch.Tensor, residual: torch.Tensor, weight: object, bias: object) -> bool:
    """Whether grad mode is on and any argument is a tensor that requires a gradient.

    Written out, not as a loop over the arguments: it runs on every eager call.
    """
    return _is_grad_enabled() and (
        x.requires_grad
        or residual.requires_grad
        or (isinstance(weight, _Tensor) and weight.requires_grad)
        or (isinstance(bias, _Tensor) and bias.requires_grad)
    )


def autocast_add(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    cuda_fp32: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Cast as torch's add and the norm behave under autocast on x's device.

    CUDA: everything to float32 where this torch build runs the norm in float32 (the op's
    registered rule does the same), else x and the residual to their promoted dtype and the
    weight and bias to it.
    CPU: weight and bias follow x's dtype, as for layer_norm and rms_norm; the residual is left
    as it is.
    """
    if x.is_cuda and cuda_fp32:
        x, weight, bias = apply_autocast(x, weight, bias)
        _, residual, _ = apply_autocast(x, residual, None)
    elif x.is_cuda:
        # torch's add promotes x and the residual; the norm then keeps h's dtype and takes the
        # weight as it is: the weight follows h here, which gives h's dtype out too.
        if x.dtype != residual.dtype and x.is_floating_point() and residual.is_floating_point():
            common = torch.promote_types(x.dtype, residual.dtype)
            x, residual = x.to(common), residual.to(common)
        x, weight, bias = apply_autocast(x, weight, bias, cuda_fp32=False)
    else:
        x, weight, bias = apply_autocast(x, weight, bias)
    return x, residual, weight, bias


def residual_for(
    x: object, residual: object, residual_dtype: object, in_place: bool
) -> torch.Tensor:
    """Return the residual the ops take for ``residual_dtype``: its dtype is h's.

    A 16-bit residual asked for a float32 h is converted to float32 here, in torch's ops (an
    extra pass; autograd and ``torch.compile`` see the conversion), so the ops keep one schema
    and derive h's dtype from the residual's.

    Raises:
        autonorm.errors.InputError: x or residual is no tensor, the residual is not x's shape,
            dtype (or float32 beside a 16-bit x) or device, or ``residual_dtype`` is refused
            (:func:`autonorm.residual_dtype.resolve_h_dtype`).

    """
    check_tensors(x, residual)
    if x.dtype not in DTYPE_NAMES:
        return residual  # the ops' validation names x's dtype
    check_residual(x, residual)
    have = DTYPE_NAMES[residual.dtype]
    want = resolve_h_dtype(DTYPE_NAMES[x.dtype], have, residual_dtype, in_place)
    return residual if want == have else residual.float()


def add_backward(
    h: torch.Tensor,
    grad_y: torch.Tensor | None,
    grad_h: torch.Tensor | None,
    needs_x: bool,
    needs_r: bool,
    norm_grads: Callable[[torch.Tensor, bool], tuple],
    x_dtype: torch.dtype | None = None,
) -> tuple:
    """Gradients of (y, h) for x, residual and the norm's parameters.

    ``h = x + residual`` feeds y, so x and residual both get ``grad_h`` plus the norm's input
    gradient; the rounding of the sum passes gradients straight through, as torch's add does.
    ``norm_grads(grad_y, needs_h)`` returns the norm's input gradient in float32 (None where not
    needed) followed by its parameters' gradients, which are returned after x's and residual's.
    The residual's gradient is in h's dtype (the residual's), x's in ``x_dtype`` (None: h's),
    each rounded once from float32.
    """
    if grad_y is None:  # only where autograd does not materialize unused outputs' gradients
        grad_y = torch.zeros_like(h)
    needs_h = needs_x or needs_r
    grad_hf, *param_grads = norm_grads(grad_y, needs_h)
    grad_x = grad_r = None
    if needs_h:
        if grad_h is not None:
            grad_hf = grad_hf + grad_h.float()
        if x_dtype is None or x_dtype == h.dtype:
            grad_x, grad_r = split_sum_grad(grad_hf.to(h.dtype), needs_x, needs_r)
        else:
            # A float32 residual beside 16-bit x: each gradient in its input's dtype; the
            # conversion makes x's a tensor of its own.
            grad_x = grad_hf.to(x_dtype) if needs_x else None
            grad_r = grad_hf.to(h.dtype) if needs_r else None
    return (grad_x, grad_r, *param_grads)


def split_sum_grad(
    grad: torch.Tensor, needs_x: bool, needs_r: bool
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The gradient of ``h = x + residual`` as x's and residual's (None where not needed)."""
    grad_x = grad if needs_x else None
    # A tensor of its own: a gradient accumulated into x.grad must not show in residual's.
    grad_r = (grad.clone() if needs_x else grad) if needs_r else None
    return grad_x, grad_r


def kernel_serves(h: torch.Tensor, grad_y: torch.Tensor | None, grad_h: torch.Tensor | None,
                  needs_h: bool) -> bool:
    """Whether the backward kernel gives h's gradient here (grad_h added in the kernel)."""
    from autonorm.torch import backward_op

    return (needs_h and grad_y is not None and backward_op.supports(h, grad_y)
            and (grad_h is None or (grad_h.dtype == h.dtype and grad_h.device == h.device)))
