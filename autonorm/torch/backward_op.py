"""The backward kernels as torch custom ops: ``torch.ops.autonorm.norm_backward``.

The registered backwards of ``autonorm.layer_norm`` and ``autonorm.rms_norm`` call this op for
CUDA tensors: one launch of the tuned backward kernel (:mod:`autonorm.ops.norm_backward`)
gives dx, dweight and dbias, the column sums in a fixed order (the same bits on every run). It
has a fake implementation, so ``torch.compile`` traces the backward graph without a break, and
it launches on torch's current stream, so CUDA graphs capture it.
"""

from __future__ import annotations

import torch

from autonorm.ops.norm_backward.problem import (
    BackwardProblem,
    LayerNormBackward,
    RMSNormBackward,
)
from autonorm.torch.checks import DTYPE_NAMES
from autonorm.torch.forward import BACKWARD_KERNELS, aligned

__all__ = ["norm_backward"]

@torch.library.custom_op(
    "autonorm::norm_backward",
    mutates_args=(),
    schema=("(Tensor dy, Tensor x, Tensor? weight, bool rms, bool has_bias, bool weight_offset, "
            "float eps, Tensor? dh=None) -> (Tensor, Tensor, Tensor)"),
)
def _norm_backward_op(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, rms: bool, has_bias: bool,
    weight_offset: bool, eps: float, dh: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _launch(dy, x, weight, rms, has_bias, weight_offset, eps, dh)


@_norm_backward_op.register_fake
def _norm_backward_fake(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, rms: bool, has_bias: bool,
    weight_offset: bool, eps: float, dh: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    hidden = x.shape[-1]
    dx = torch.empty_like(x, memory_format=torch.contiguous_format)
    dw = x.new_empty(hidden if weight is not None else 0)
    db = x.new_empty(hidden if has_bias and not rms else 0)
    return dx, dw, db


def norm_backward(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, *, rms: bool,
    has_bias: bool = False, weight_offset: bool = False, eps: float,
    dh: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Return ``(dx, dweight, dbias)`` of a norm of CUDA tensors, in x's dtype (None: absent).

    Args:
        dy: the output's gradient, x's shape and dtype.
        x: the forward's input.
        weight: the forward's weight, or None.
        rms: RMSNorm (else LayerNorm).
        has_bias: the LayerNorm had a bias.
        weight_offset: the RMSNorm scaled by ``1 + weight``.
        eps: the forward's eps.
        dh: after a fused residual add (x is then the returned h), the gradient of h, added to
            dx in the kernel.
    """
    dx, dw, db = _norm_backward_op(dy, x, weight, rms, has_bias and not rms, weight_offset, eps,
                                   dh)
    return dx, (dw if weight is not None else None), (db if has_bias and not rms else None)


def supports(x: torch.Tensor, grad_y: torch.Tensor) -> bool:
    """Whether the backward kernel serves these tensors (CUDA, a dtype it has, one device)."""
    return (x.is_cuda and grad_y.is_cuda and x.dtype in DTYPE_NAMES
            and grad_y.dtype == x.dtype and x.device == grad_y.device and x.numel() > 0)


def _problem(key: tuple) -> BackwardProblem:
    _, dtype, hidden, rms, has_weight, flag, residual, _ = key
    if rms:
        return RMSNormBackward(hidden, DTYPE_NAMES[dtype], has_weight, flag, residual)
    return LayerNormBackward(hidden, DTYPE_NAMES[dtype], has_weight, flag, residual)


def _launch(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, rms: bool, has_bias: bool,
    weight_offset: bool, eps: float, dh: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the dispatched backward kernel on torch's current stream."""
    from autonorm.ops.base import rows_bucket

    hidden = x.shape[-1]
    rows = x.numel() // hidden
    device = x.device.index if x.device.index is not None else torch.cuda.current_device()
    key = (device, x.dtype, hidden, rms, weight is not None,
           weight_offset if rms else has_bias, dh is not None, rows_bucket(rows))
    cached = BACKWARD_KERNELS.get(key)
    if cached is None:
        from autonorm.dispatch import get_kernel

        problem = _problem(key)
        cached = BACKWARD_KERNELS[key] = (get_kernel(problem, rows, device), problem)
    kernel, problem = cached
    xc, dyc = aligned(x), aligned(dy)
    wc = None if weight is None else aligned(weight)
    dhc = None if dh is None else aligned(dh)
    dx = torch.empty_like(xc)
    dw = x.new_empty(hidden if weight is not None else 0)
    db = x.new_empty(hidden if problem.has_bias else 0)
    clusters = kernel.grid(rows) // kernel.plan.cluster
    partials = torch.empty(problem.partial_floats(rows, clusters), dtype=torch.float32,
                           device=x.device)

    def ptr(t: torch.Tensor | None) -> int:
        return 0 if t is None or t.numel() == 0 else t.data_ptr()

    stream = torch.cuda.current_stream(x.device).cuda_stream
    with torch.cuda.device(x.device):
        kernel.launch((ptr(xc), ptr(dyc), ptr(wc), ptr(dx), ptr(dw), ptr(db), ptr(partials),
                       ptr(dhc), rows, float(eps)), stream)
    return dx, dw, db
