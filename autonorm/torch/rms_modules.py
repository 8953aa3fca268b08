"""The :class:`RMSNorm` module (a drop-in ``torch.nn.RMSNorm``) and the model swap.

:func:`replace_rms_norms` swaps every ``torch.nn.RMSNorm`` of a model for the autonorm one, and
any RMSNorm class of the model's own that it is told how to read (its weight and eps attributes,
the weight's form), sharing the parameters, so optimizers built before the swap keep training
them.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import init

from autonorm.errors import InputError, ShapeError
from autonorm.torch.rms_op import rms_norm

__all__ = ["RMSNorm", "replace_rms_norms"]

_is_compiling = torch.compiler.is_compiling

# What replace_rms_norms' ``classes`` may say of a class: keyword arguments of from_torch.
_LAYOUT_KEYS = ("weight", "eps", "weight_offset")


class RMSNorm(nn.RMSNorm):
    """Drop-in replacement for :class:`torch.nn.RMSNorm` that runs the autonorm kernel.

    Same constructor, parameter (``weight``), ``state_dict`` keys, initialization (ones),
    ``reset_parameters`` and ``extra_repr`` as ``torch.nn.RMSNorm``: it subclasses it and
    replaces ``forward``, so ``isinstance(m, torch.nn.RMSNorm)`` stays true. ``eps=None`` takes
    torch's default (float32's machine epsilon). A ``normalized_shape`` of several dimensions is
    normalized over their product (the input is viewed as (..., prod)), as torch does.

    Args:
        normalized_shape: size of the trailing dimension(s) to normalize over.
        eps: added to the mean of squares; None or > 0 (torch accepts 0, the kernel does not).
        elementwise_affine: learn a per-element weight.
        device: device of the parameter.
        dtype: dtype of the parameter.
        weight_offset: keyword only; scale by ``1 + weight`` (Gemma's form, which initializes
            the weight to zeros) instead of ``weight``. Needs ``elementwise_affine``.

    Raises:
        autonorm.errors.InputError: eps <= 0, or a weight_offset that is no bool or has no
            weight.

    """

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float | None = None,
        elementwise_affine: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        weight_offset: bool = False,
    ) -> None:
        if eps is not None and not (
            isinstance(eps, numbers.Real) and not isinstance(eps, bool) and eps > 0
        ):
            raise InputError(f"RMSNorm eps must be None or > 0, got {eps!r}")
        if type(weight_offset) is not bool:
            raise InputError(
                f"RMSNorm weight_offset must be True or False, got {weight_offset!r}"
            )
        if weight_offset and not elementwise_affine:
            raise InputError(
                "RMSNorm weight_offset=True scales by 1 + weight: it needs elementwise_affine"
            )
        # Set before the parent's __init__, whose reset_parameters reads it.
        self.weight_offset = weight_offset
        super().__init__(normalized_shape, eps, elementwise_affine, device, dtype)

    def reset_parameters(self) -> None:
        """Set the weight to the identity scale: ones, or zeros in the ``1 + weight`` form."""
        if self.elementwise_affine:
            (init.zeros_ if self.weight_offset else init.ones_)(self.weight)

    def extra_repr(self) -> str:
        """Return torch's representation, plus the weight's form where it is ``1 + weight``."""
        text = super().extra_repr()
        return text + ", weight_offset=True" if self.weight_offset else text

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Normalize the trailing ``normalized_shape`` dimensions of ``input``."""
        shape = self.normalized_shape
        if input.shape[-len(shape) :] != shape:
            raise ShapeError(
                f"RMSNorm{shape} got input of shape {tuple(input.shape)}: its trailing "
                f"dimensions must be {shape}"
            )
        if _is_compiling():
            weight = self.weight
        else:
            # self.weight costs ~0.6 µs (nn.Module.__getattr__); read the dict it reads.
            # Parametrized modules have no entry: fall back.
            params = self._parameters
            weight = params["weight"] if "weight" in params else self.weight
        if len(shape) == 1:
            return rms_norm(input, weight, self.eps, self.weight_offset)
        hidden = math.prod(shape)
        if weight is not None:
            weight = weight.reshape(hidden)
        flat = input.reshape(*input.shape[: -len(shape)], hidden)
        return rms_norm(flat, weight, self.eps, self.weight_offset).reshape(input.shape)

    @classmethod
    def from_torch(
        cls,
        module: nn.Module,
        *,
        weight: str = "weight",
        eps: str = "eps",
        weight_offset: bool = False,
        share_parameters: bool = True,
    ) -> RMSNorm:
        """Build an autonorm RMSNorm with the configuration and parameter of ``module``.

        ``module`` is a ``torch.nn.RMSNorm``, or a model's own RMSNorm class whose forward is
        ``x / sqrt(mean(x^2) + eps) * w`` over the last dimension, read through the attribute
        names given (see :func:`replace_rms_norms` for Llama's and Gemma's).

        Args:
            module: the module to copy.
            weight: name of its weight attribute (a Parameter of shape (hidden,), or None).
            eps: name of its eps attribute (a number > 0, or None for torch's default).
            weight_offset: its forward scales by ``1 + weight`` (Gemma's form).
            share_parameters: reuse ``module``'s Parameter (default), so optimizers, tied
                weights and sharding wrappers that hold it keep working; False copies it.

        Returns:
            The new module, in ``module``'s training mode. Hooks are not carried over.

        Raises:
            autonorm.errors.InputError: ``module`` is no module, lacks an attribute, or its eps
                or weight cannot be served.

        """
        if not isinstance(module, nn.Module):
            raise InputError(f"from_torch expects an RMSNorm module, got {type(module)}")
        for name in (weight, eps):
            if not hasattr(module, name):
                raise InputError(f"{type(module).__name__} has no attribute {name!r}")
        param, eps_value = getattr(module, weight), getattr(module, eps)
        if param is not None and not isinstance(param, nn.Parameter):
            raise InputError(
                f"{type(module).__name__}.{weight} must be an nn.Parameter or None, got "
                f"{type(param).__name__}"
            )
        shape = module.normalized_shape if isinstance(module, nn.RMSNorm) else None
        if shape is None:
            if param is None:
                raise InputError(
                    f"{type(module).__name__} has no weight to size the norm from: only a "
                    "torch.nn.RMSNorm may have none"
                )
            shape = tuple(param.shape)
        # Allocate on the meta device: the real parameter is assigned right after.
        new = cls(
            shape,
            eps_value,
            param is not None,
            device="meta",
            weight_offset=weight_offset,
        )
        if param is not None and not share_parameters:
            param = nn.Parameter(param.detach().clone(), requires_grad=param.requires_grad)
        new.weight = param
        new.train(module.training)
        return new


def replace_rms_norms(
    model: nn.Module, classes: Mapping[type, Mapping[str, Any]] | None = None
) -> int:
    """Swap every ``torch.nn.RMSNorm`` inside ``model`` (and ``classes``) for :class:`RMSNorm`.

    In place; the new modules share the old ones' parameters (see :meth:`RMSNorm.from_torch`),
    so an optimizer built before the swap still trains them. A module reachable under several
    names is replaced by one shared module. Only exact instances of the classes are swapped:
    subclasses may override ``forward``. Modules whose eps is <= 0 (which the kernel cannot run)
    are left alone with a warning.

    A model's own RMSNorm class is swapped when ``classes`` says how to read it: the keyword
    arguments of :meth:`RMSNorm.from_torch` (``weight`` and ``eps``, the attribute names,
    ``weight_offset``, the weight's form). For Hugging Face models::

        replace_rms_norms(model, {LlamaRMSNorm: {"eps": "variance_epsilon"}})  # Llama, Qwen2
        replace_rms_norms(model, {GemmaRMSNorm: {"weight_offset": True}})  # y * (1 + weight)

    Swap only classes whose forward computes the norm over the last dimension with the weight in
    x's dtype. The kernel rounds once where Llama's rounds the normalized x to x's dtype before
    scaling, a difference within the dtype's rounding; a weight of another dtype than x (say a
    float32 weight with bfloat16 activations) is refused at the first forward.

    Args:
        model: the model to modify.
        classes: other RMSNorm classes to swap, each mapped to the keyword arguments of
            :meth:`RMSNorm.from_torch` that read it (an empty mapping for torch's names).

    Returns:
        The number of distinct modules replaced.

    Raises:
        autonorm.errors.InputError: ``model`` is no module, or itself one of the classes (it
            cannot be swapped in place: use :meth:`RMSNorm.from_torch`), or ``classes`` is
            malformed.

    """
    if not isinstance(model, nn.Module):
        raise InputError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    layouts = {nn.RMSNorm: {}, **_checked_classes(classes)}
    if type(model) in layouts:
        raise InputError("model is itself an RMSNorm: use autonorm.torch.RMSNorm.from_torch")
    # _modules, not named_children(): the latter hides a module registered twice in one parent.
    slots = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent._modules.items()
        if type(child) in layouts
    ]
    replaced: dict[int, RMSNorm | None] = {}
    for parent, name, child in slots:
        if id(child) not in replaced:
            layout = layouts[type(child)]
            eps = getattr(child, layout.get("eps", "eps"), None)
            # A non-number eps goes on to from_torch, which refuses it by name.
            if eps is None or not isinstance(eps, numbers.Real) or eps > 0:
                replaced[id(child)] = RMSNorm.from_torch(child, **layout)
            else:
                warnings.warn(
                    f"not replacing {name} ({child}): autonorm needs eps > 0", stacklevel=2
                )
                replaced[id(child)] = None
        new = replaced[id(child)]
        if new is not None:
            setattr(parent, name, new)
    return sum(new is not None for new in replaced.values())


def _checked_classes(classes: object) -> dict[type, dict[str, Any]]:
    """Return ``classes`` as a dict of class -> from_torch keywords, or raise naming the fault."""
    if classes is None:
        return {}
    if not isinstance(classes, Mapping):
        raise InputError(
            f"classes must map module classes to dicts of {', '.join(_LAYOUT_KEYS)}, got "
            f"{type(classes).__name__}"
        )
    checked: dict[type, dict[str, Any]] = {}
    for cls, layout in classes.items():
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            raise InputError(f"classes keys must be nn.Module classes, got {cls!r}")
        if not isinstance(layout, Mapping):
            raise InputError(
                f"classes[{cls.__name__}] must be a dict of {', '.join(_LAYOUT_KEYS)}, got "
                f"{type(layout).__name__}"
            )
        unknown = sorted(set(layout) - set(_LAYOUT_KEYS))
        if unknown:
            raise InputError(
                f"classes[{cls.__name__}] has unknown keys {unknown}: use {', '.join(_LAYOUT_KEYS)}"
            )
        checked[cls] = dict(layout)
    return checked
