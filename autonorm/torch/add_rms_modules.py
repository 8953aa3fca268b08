"""The :class:`FusedAddRMSNorm` module: the residual add and RMSNorm of a decoder block.

``forward(x, residual)`` returns ``(y, h)`` like Liger's ``LigerFusedAddRMSNorm``, with the same
``state_dict`` (one ``weight``), so a model written for one runs with the other.
"""

from __future__ import annotations

import numbers

import torch
from torch import nn
from torch.nn import init

from autonorm.errors import InputError, ShapeError
from autonorm.torch.add_rms_op import add_rms_norm

__all__ = ["FusedAddRMSNorm"]

_is_compiling = torch.compiler.is_compiling


class FusedAddRMSNorm(nn.Module):
    """``h = x + residual`` and ``y = rms_norm(h) * w`` in one kernel: ``forward`` gives (y, h).

    The usual pre-norm block, ``residual = x + residual; x = norm(residual)``, becomes
    ``x, residual = norm(x, residual)``. ``h`` is rounded to the residual's dtype once and
    ``y`` is the norm of exactly that ``h`` in x's dtype (:func:`autonorm.torch.add_rms_norm`):
    a float32 residual beside 16-bit x keeps the residual stream, h, in float32.

    Args:
        hidden_size: size of the last dimension.
        eps: added to the mean of squares; > 0, or None for torch's default (float32's machine
            epsilon). Liger's default, 1e-6, is the default here.
        elementwise_affine: learn a per-element weight (``weight``, shape (hidden_size,)).
        device: device of the parameter.
        dtype: dtype of the parameter.
        weight_offset: keyword only; scale by ``1 + weight`` (Gemma's form, weight initialized
            to zeros) instead of ``weight`` (initialized to ones). Needs ``elementwise_affine``.
        in_place: keyword only; vLLM's semantics, writing y into x and h into residual (no
            gradient: for inference under ``torch.no_grad()`` or ``torch.inference_mode()``).

    Raises:
        autonorm.errors.InputError: a hidden size that is no positive int, eps <= 0, or a
            weight_offset or in_place that is no bool (or an offset without a weight).

    """

    def __init__(
        self,
        hidden_size: int,
        eps: float | None = 1e-6,
        elementwise_affine: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        weight_offset: bool = False,
        in_place: bool = False,
    ) -> None:
        if isinstance(hidden_size, bool) or not isinstance(hidden_size, int) or hidden_size < 1:
            raise InputError(
                f"FusedAddRMSNorm hidden_size must be a positive int, got {hidden_size!r}"
            )
        if eps is not None and not (
            isinstance(eps, numbers.Real) and not isinstance(eps, bool) and eps > 0
        ):
            raise InputError(f"FusedAddRMSNorm eps must be None or > 0, got {eps!r}")
        for name, value in (("weight_offset", weight_offset), ("in_place", in_place)):
            if type(value) is not bool:
                raise InputError(f"FusedAddRMSNorm {name} must be True or False, got {value!r}")
        if weight_offset and not elementwise_affine:
            raise InputError(
                "FusedAddRMSNorm weight_offset=True scales by 1 + weight: it needs "
                "elementwise_affine"
            )
        super().__init__()
        self.hidden_size = hidden_size
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.weight_offset = weight_offset
        self.in_place = in_place
        if elementwise_affine:
            self.weight = nn.Parameter(torch.empty(hidden_size, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Set the weight to the identity scale: ones, or zeros in the ``1 + weight`` form."""
        if self.weight is not None:
            (init.zeros_ if self.weight_offset else init.ones_)(self.weight)

    def extra_repr(self) -> str:
        """Return e.g. ``4096, eps=1e-06, elementwise_affine=True``, plus the non-defaults."""
        text = f"{self.hidden_size}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
        if self.weight_offset:
            text += ", weight_offset=True"
        if self.in_place:
            text += ", in_place=True"
        return text

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(rms_norm(x + residual), x + residual)`` over the last dimension."""
        if x.shape[-1:] != (self.hidden_size,):
            raise ShapeError(
                f"FusedAddRMSNorm({self.hidden_size}) got x of shape {tuple(x.shape)}: its last "
                f"dimension must be {self.hidden_size}"
            )
        if _is_compiling():
            weight = self.weight
        else:
            # As in RMSNorm.forward: the parameter dict is cheaper than nn.Module.__getattr__.
            params = self._parameters
            weight = params["weight"] if "weight" in params else self.weight
        return add_rms_norm(x, residual, weight, self.eps, self.weight_offset, self.in_place)
