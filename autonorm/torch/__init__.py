"""PyTorch integration: :func:`layer_norm`, :func:`rms_norm`, the fused residual adds, modules.

Everything here takes and returns ``torch.Tensor`` and never copies data between libraries: the
autonorm kernel reads and writes torch's own memory through ``data_ptr()`` and runs on torch's
current CUDA stream, so it is ordered with the surrounding torch work and can be captured in a
CUDA graph. CPU (and any non-CUDA) tensors are computed with ``torch.nn.functional.layer_norm``
(``rms_norm``), so the same code runs anywhere.

Three ways in, cheapest first:

* eager inference (no gradient needed, not compiling): validate, allocate the output, launch.
  The kernel object is cached per (device, dtype, hidden, weight form, rows bucket)
  (:mod:`.forward`), so a hot call is a few attribute reads, one allocation and the launch.
* autograd or ``torch.compile``: the custom ops ``torch.ops.autonorm.layer_norm``
  (:mod:`.custom_op`), ``torch.ops.autonorm.rms_norm`` (:mod:`.rms_op`),
  ``torch.ops.autonorm.add_rms_norm`` (:mod:`.add_rms_op`) and
  ``torch.ops.autonorm.add_layer_norm`` (:mod:`.add_ln_op`), each with a fake (meta)
  implementation for tracing, an autograd formula written in PyTorch ops and an autocast rule,
  so compiled graphs contain them without graph breaks; and ``fused_add_rms_norm_`` and
  ``fused_add_layer_norm_``, the in-place forms for inference engines (a fake, declared
  mutations, no autograd).
* tensor subclasses and active dispatch modes (FakeTensor, make_fx, FlopCounterMode): the custom
  op too, so they see the operator instead of a raw kernel launch.

The modules: :mod:`.checks` (argument validation), :mod:`.forward` (the kernel caches and the
CUDA and reference forwards), :mod:`.custom_op` (the LayerNorm op, its fake, autograd and
autocast, and :func:`layer_norm`), :mod:`.rms_op` (the same for :func:`rms_norm`),
:mod:`.residual_forward` (the residual-add forwards), :mod:`.add_route` (what the residual-add
ops share: call routing, the in-place form, autocast and backward), :mod:`.add_rms_op` and
:mod:`.add_ln_op` (the residual add and RMSNorm, :func:`add_rms_norm`, or LayerNorm,
:func:`add_layer_norm`), :mod:`.modules` (:class:`LayerNorm` and :func:`replace_layer_norms`),
:mod:`.rms_modules` (:class:`RMSNorm` and :func:`replace_rms_norms`) and :mod:`.add_rms_modules`
(:class:`FusedAddRMSNorm`).
Kernels come from :mod:`autonorm.dispatch`, imported at the first launch.

PyTorch is an optional dependency (``pip install 'autonorm[torch]'``); ``import autonorm`` never
imports this package.
"""

from __future__ import annotations

try:
    import torch  # noqa: F401 - fail here, with the install hint, before any module below
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "autonorm.torch needs PyTorch: install it, e.g. pip install 'autonorm[torch]'"
    ) from exc

from autonorm.torch.add_ln_op import add_layer_norm
from autonorm.torch.add_rms_modules import FusedAddRMSNorm
from autonorm.torch.add_rms_op import add_rms_norm
from autonorm.torch.custom_op import layer_norm
from autonorm.torch.forward import clear_kernel_cache
from autonorm.torch.modules import LayerNorm, replace_layer_norms
from autonorm.torch.rms_modules import RMSNorm, replace_rms_norms
from autonorm.torch.rms_op import rms_norm

__all__ = [
    "FusedAddRMSNorm",
    "LayerNorm",
    "RMSNorm",
    "add_layer_norm",
    "add_rms_norm",
    "clear_kernel_cache",
    "layer_norm",
    "replace_layer_norms",
    "replace_rms_norms",
    "rms_norm",
]
