"""The :class:`LayerNorm` module (a drop-in ``torch.nn.LayerNorm``) and the model swap.

:func:`replace_layer_norms` swaps every ``torch.nn.LayerNorm`` of a model for the autonorm one,
sharing the parameters, so optimizers built before the swap keep training them.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Sequence

import torch
from torch import nn

from autonorm.errors import InputError, ShapeError
from autonorm.torch.custom_op import layer_norm

__all__ = ["LayerNorm", "replace_layer_norms"]

_is_compiling = torch.compiler.is_compiling


class LayerNorm(nn.LayerNorm):
    """Drop-in replacement for :class:`torch.nn.LayerNorm` that runs the autonorm kernel.

    Same constructor, parameters, ``state_dict`` keys, initialization (weight ones, bias zeros),
    ``reset_parameters`` and ``extra_repr`` as ``torch.nn.LayerNorm``: it subclasses it and only
    replaces ``forward``, so ``isinstance(m, torch.nn.LayerNorm)`` stays true for code that
    initializes weights or groups parameters by module type. A ``normalized_shape`` of several
    dimensions is normalized over their product (the input is viewed as (..., prod)).

    Args:
        normalized_shape: size of the trailing dimension(s) to normalize over.
        eps: added to the variance; must be > 0 (torch accepts 0, the kernel does not).
        elementwise_affine: learn a per-element weight (and bias).
        bias: learn a bias too (only with ``elementwise_affine``).
        device: device of the parameters.
        dtype: dtype of the parameters.

    Raises:
        autonorm.errors.InputError: eps <= 0.

    """

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        if not (isinstance(eps, numbers.Real) and eps > 0):
            raise InputError(f"LayerNorm eps must be > 0, got {eps!r}")
        super().__init__(normalized_shape, eps, elementwise_affine, bias, device, dtype)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Normalize the trailing ``normalized_shape`` dimensions of ``input``."""
        shape = self.normalized_shape
        if input.shape[-len(shape) :] != shape:
            raise ShapeError(
                f"LayerNorm{shape} got input of shape {tuple(input.shape)}: its trailing "
                f"dimensions must be {shape}"
            )
        if _is_compiling():
            weight, bias = self.weight, self.bias
        else:
            # self.weight costs ~0.6 µs (nn.Module.__getattr__ runs after a failed ordinary
            # lookup); read the dict it reads. Parametrized modules have no entry: fall back.
            params = self._parameters
            weight = params["weight"] if "weight" in params else self.weight
            bias = params["bias"] if "bias" in params else self.bias
        if len(shape) == 1:
            return layer_norm(input, weight, bias, self.eps)
        hidden = math.prod(shape)
        if weight is not None:
            weight = weight.reshape(hidden)
        if bias is not None:
            bias = bias.reshape(hidden)
        flat = input.reshape(*input.shape[: -len(shape)], hidden)
        return layer_norm(flat, weight, bias, self.eps).reshape(input.shape)

    @classmethod
    def from_torch(cls, module: nn.LayerNorm, *, share_parameters: bool = True) -> LayerNorm:
        """Build an autonorm LayerNorm with the configuration and parameters of ``module``.

        Args:
            module: the ``torch.nn.LayerNorm`` to copy.
            share_parameters: reuse ``module``'s Parameter objects (default), so optimizers,
                tied weights and sharding wrappers that hold them keep working; False gives the
                new module its own copies.

        Returns:
            The new module, in ``module``'s training mode. Hooks are not carried over.

        Raises:
            autonorm.errors.InputError: ``module`` is not a LayerNorm, or its eps is <= 0.

        """
        if not isinstance(module, nn.LayerNorm):
            raise InputError(f"from_torch expects a torch.nn.LayerNorm, got {type(module)}")
        # Allocate on the meta device: the real parameters are assigned right after.
        new = cls(
            module.normalized_shape,
            module.eps,
            module.elementwise_affine,
            bias=module.bias is not None,
            device="meta",
        )
        for name in ("weight", "bias"):
            param = getattr(module, name)
            if param is not None and not share_parameters:
                param = nn.Parameter(param.detach().clone(), requires_grad=param.requires_grad)
            setattr(new, name, param)
        new.train(module.training)
        return new


def replace_layer_norms(model: nn.Module) -> int:
    """Swap every ``torch.nn.LayerNorm`` inside ``model`` for an autonorm :class:`LayerNorm`.

    In place; the new modules share the old ones' parameters (see :meth:`LayerNorm.from_torch`),
    so an optimizer built before the swap still trains them. A LayerNorm reachable under several
    names is replaced by one shared module. Only exact ``torch.nn.LayerNorm`` instances are
    swapped: subclasses may override ``forward``. Modules with eps <= 0 (which the kernel cannot
    run) are left alone with a warning.

    Args:
        model: the model to modify.

    Returns:
        The number of distinct LayerNorm modules replaced.

    Raises:
        autonorm.errors.InputError: ``model`` is no module, or itself a LayerNorm (it cannot be
            swapped in place: use :meth:`LayerNorm.from_torch`).

    """
    if not isinstance(model, nn.Module):
        raise InputError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if type(model) is nn.LayerNorm:
        raise InputError("model is itself a LayerNorm: use autonorm.torch.LayerNorm.from_torch")
    # _modules, not named_children(): the latter hides a module registered twice in one parent.
    slots = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent._modules.items()
        if type(child) is nn.LayerNorm
    ]
    replaced: dict[int, LayerNorm | None] = {}
    for parent, name, child in slots:
        if id(child) not in replaced:
            if child.eps > 0:
                replaced[id(child)] = LayerNorm.from_torch(child)
            else:
                warnings.warn(
                    f"not replacing {name} ({child}): autonorm needs eps > 0", stacklevel=2
                )
                replaced[id(child)] = None
        new = replaced[id(child)]
        if new is not None:
            setattr(parent, name, new)
    return sum(new is not None for new in replaced.values())
