"""Ops: what differs between the norms compared (everything else is shared).

``OPS`` holds one ``Op`` a norm: its implementations, its bytes, its float64 reference and the
calls that are timed.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

from .constants import REPO


def put_repo_on_path() -> None:
    """Import autonorm from this checkout when it is one (before an installed copy)."""
    if (REPO / "autonorm" / "__init__.py").is_file() and str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))


def _layer_norm_eager(F, shape, x, w, b, eps: float, r=None):  # noqa: N803, ARG001
    hid = (shape.hidden,)
    return lambda: F.layer_norm(x, hid, w, b, eps)


def _rms_norm_eager(F, shape, x, w, b, eps: float, r=None):  # noqa: N803, ARG001
    hid = (shape.hidden,)
    return lambda: F.rms_norm(x, hid, w, eps)


def _add_rms_norm_eager(F, shape, x, w, b, eps: float, r=None):  # noqa: N803, ARG001
    hid = (shape.hidden,)

    def add_then_norm():
        h = x + r
        return F.rms_norm(h, hid, w, eps), h

    return add_then_norm


def _layer_norm_compiled(F):  # noqa: N803
    def ln(x, w, b, eps: float, r=None):  # noqa: ARG001 - one signature for every op
        return F.layer_norm(x, (x.shape[-1],), w, b, eps)

    return ln


def _rms_norm_compiled(F):  # noqa: N803
    def rms(x, w, b, eps: float, r=None):  # noqa: ARG001 - one signature for every op
        return F.rms_norm(x, (x.shape[-1],), w, eps)

    return rms


def _add_rms_norm_compiled(F):  # noqa: N803
    def add_rms(x, w, b, eps: float, r=None):  # noqa: ARG001 - one signature for every op
        # The add and the norm in one compiled function, so Inductor can fuse them.
        h = x + r
        return F.rms_norm(h, (x.shape[-1],), w, eps), h

    return add_rms


def _layer_norm_reference(F, shape, x, w, b, eps: float, r=None):  # noqa: N803, ARG001
    import torch

    f64 = torch.float64
    return F.layer_norm(x.to(f64), (shape.hidden,), w.to(f64), b.to(f64), eps)


def _rms_norm_reference(F, shape, x, w, b, eps: float, r=None):  # noqa: N803, ARG001
    """autonorm's float64 RMSNorm reference on CuPy views; the same formula in torch without
    CuPy (a machine where autonorm cannot run still checks its peers)."""
    import torch

    x64, w64 = x.to(torch.float64), w.to(torch.float64)
    put_repo_on_path()
    try:
        import cupy

        from autonorm.ops.rms_norm.reference import rms_norm_reference
    except ImportError:
        return x64 * torch.rsqrt((x64 * x64).mean(-1, keepdim=True) + eps) * w64
    y = rms_norm_reference(cupy.from_dlpack(x64), cupy.from_dlpack(w64), eps)
    return torch.from_dlpack(y)


def rounded_sum(x, r):
    """``x + r`` summed in float64 and rounded to x's dtype: the correctly rounded sum.

    Rounding the sum to float64 first, or to float32 on the way to bf16 or fp16, rounds once in
    effect: each intermediate format has at least 2p + 2 bits for a sum of two p-bit numbers,
    and there rounding twice equals rounding once (the same bits as
    ``autonorm.numerics.from_float64``; tests/test_peers_add_rms.py compares them).
    """
    import torch

    return (x.to(torch.float64) + r.to(torch.float64)).to(x.dtype)


def _add_rms_norm_reference(F, shape, x, w, b, eps: float, r=None):  # noqa: N803
    """(y, h) in float64: h the sum rounded to the dtype, y the RMSNorm reference of that h."""
    import torch

    h = rounded_sum(x, r)
    return _rms_norm_reference(F, shape, h, w, b, eps), h.to(torch.float64)


@dataclass(frozen=True)
class Op:
    """One norm the benchmark compares: its peers, its bytes, its reference and its calls.

    The builders take the bound inputs (``r``: the residual, None for a norm without one) and
    return the zero-argument callable that is timed, so each op calls its functions directly
    (no adapter inside the timed call). That callable returns y, or ``(y, h)`` for the fused
    add; the reference returns the same in float64.
    """

    title: str  # in the tables and the plot, e.g. "LayerNorm forward"
    impls: tuple[str, ...]  # the implementations that exist for it, in ALL_IMPLS' order
    has_bias: bool  # a bias is made, passed and counted
    entry: str  # autonorm's function, in autonorm and autonorm.torch
    liger: tuple[str, str]  # Liger-Kernel's module and autograd Function
    eager: Callable  # (F, shape, x, w, b, eps, r) -> callable
    compiled: Callable  # (F) -> fn(x, w, b, eps, r), compiled once per dtype
    liger_call: Callable  # (Function, x, w, b, eps, r) -> callable
    autonorm_call: Callable  # (autonorm's function, x, w, b, eps, r) -> callable
    reference: Callable  # (F, shape, x, w, b, eps, r) -> float64 torch tensor (or y, h)
    has_residual: bool = False  # a residual is made, added, passed and counted; h returned
    # (autonorm's function, x, w, b, eps, r) -> callable writing y into x and h into r
    in_place_call: Callable | None = None

    @property
    def vectors(self) -> int:
        """Hidden-sized vectors read once besides x: the weight, and the bias where one is."""
        return 1 + int(self.has_bias)

    @property
    def row_streams(self) -> int:
        """x-sized tensors moved once: x read and y written, and the residual read and h
        written where there is one."""
        return 2 + 2 * int(self.has_residual)


OPS: dict[str, Op] = {
    "layer_norm": Op(
        title="LayerNorm forward", impls=("autonorm", "eager", "compile", "triton", "liger"),
        has_bias=True, entry="layer_norm",
        liger=("liger_kernel.ops.layer_norm", "LigerLayerNormFunction"),
        eager=_layer_norm_eager, compiled=_layer_norm_compiled,
        liger_call=lambda fn, x, w, b, eps, r=None: lambda: fn.apply(x, w, b, eps),
        autonorm_call=lambda fn, x, w, b, eps, r=None: lambda: fn(x, w, b, eps),
        reference=_layer_norm_reference,
    ),
    "rms_norm": Op(
        title="RMSNorm forward", impls=("autonorm", "eager", "compile", "liger"), has_bias=False,
        entry="rms_norm", liger=("liger_kernel.ops.rms_norm", "LigerRMSNormFunction"),
        eager=_rms_norm_eager, compiled=_rms_norm_compiled,
        # Liger's defaults: no offset, "llama" casting (fp32 statistics, as autonorm's).
        liger_call=lambda fn, x, w, b, eps, r=None: lambda: fn.apply(x, w, eps),
        autonorm_call=lambda fn, x, w, b, eps, r=None: lambda: fn(x, w, eps=eps),
        reference=_rms_norm_reference,
    ),
    "add_rms_norm": Op(
        title="Fused add + RMSNorm forward",
        impls=("autonorm", "autonorm-inplace", "eager", "compile", "liger"), has_bias=False,
        entry="add_rms_norm",
        liger=("liger_kernel.ops.fused_add_rms_norm", "LigerFusedAddRMSNormFunction"),
        eager=_add_rms_norm_eager, compiled=_add_rms_norm_compiled,
        # Liger's defaults: no offset, "llama" casting; it returns (y, h) as autonorm does.
        liger_call=lambda fn, x, w, b, eps, r=None: lambda: fn.apply(x, r, w, eps),
        autonorm_call=lambda fn, x, w, b, eps, r=None: lambda: fn(x, r, w, eps=eps),
        reference=_add_rms_norm_reference,
        has_residual=True,
        in_place_call=lambda fn, x, w, b, eps, r=None: lambda: fn(x, r, w, eps=eps,
                                                                   in_place=True),
    ),
}
