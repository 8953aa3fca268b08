"""Run-time dispatch: find the kernel for this GPU and shape, compile it once, launch it.

Lookup order for a (device, dtype, hidden, affine flags, rows bucket):

1. the user's DB, exact key;
2. the shipped DB (``tuning_db/``), exact key;
3. the same hidden size in the nearest rows bucket (user DB, then shipped DB);
4. :func:`autonorm.space.default_config`, correct for any hidden size.

Under ``AUTONORM_NO_KEEP_X=1`` the pick is launched without its L2 hint (``keep_x``): the same
arithmetic and bits, a kernel that leaves L2's priorities alone.

Compiled kernels are cached in the process: a call with a known key is a dict lookup, with no
DB query and no compile.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from autonorm.dtypes import normalize_dtype
from autonorm.errors import (
    DeviceMismatchError,
    InputError,
    ShapeError,
    UnsupportedDtypeError,
)
from autonorm.ops.base import rows_bucket
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.space import default_config


@dataclass(frozen=True)
class Choice:
    """Which configuration dispatch picked, and where it came from."""

    config: KernelConfig
    source: str  # "user", "shipped", "user-nearest", "shipped-nearest" or "default"


_KERNELS: dict[tuple[int, Problem, int], Any] = {}
_CHOICES: dict[tuple[int, Problem, int], Choice] = {}
_LOCK = threading.Lock()


def choose_config(problem: Problem, rows: int, device_id: int = 0) -> Choice:
    """Look up the configuration for ``problem`` at ``rows`` rows on a GPU (no compile).

    Under ``AUTONORM_NO_KEEP_X=1`` the configuration found is returned with ``keep_x`` off.
    """
    from autonorm import settings as config

    choice = _look_up(problem, rows, device_id)
    if choice.config.keep_x and not config.keep_x_allowed():
        return Choice(dataclasses.replace(choice.config, keep_x=False), choice.source)
    return choice


def _look_up(problem: Problem, rows: int, device_id: int) -> Choice:
    """The lookup order of this module's docstring."""
    from autonorm.ops import layer_norm as codegen
    from autonorm.runtime.device import query_device
    from autonorm.store import db

    info = query_device(device_id)
    key = db.TuningKey.for_problem(info.fingerprint, codegen.code_version(), problem, rows)
    stores = []
    try:
        stores.append(("user", db.TuningDB.open_user()))
    except Exception:  # noqa: BLE001 - a broken user DB must not stop inference
        pass
    shipped = db.TuningDB.open_shipped()
    if shipped is not None:
        stores.append(("shipped", shipped))
    try:
        for exact in (True, False):
            for source, store in stores:
                winner = store.get_winner(key) if exact else store.nearest_winner(key)
                if winner is not None:
                    config = KernelConfig.from_dict(winner.config)
                    from autonorm.ops.layer_norm.rules import check

                    if not check(config, problem, info.limits()):
                        return Choice(config, source if exact else f"{source}-nearest")
    finally:
        for _, store in stores:
            store.close()
    return Choice(default_config(problem, info.limits()), "default")


def get_kernel(problem: Problem, rows: int, device_id: int = 0) -> Any:
    """Return the compiled kernel for ``problem`` at ``rows`` rows on GPU ``device_id``.

    The first call for a key looks it up and compiles; later calls are a dict lookup.
    """
    key = (device_id, problem, rows_bucket(rows))
    kernel = _KERNELS.get(key)
    if kernel is not None:
        return kernel
    with _LOCK:
        kernel = _KERNELS.get(key)
        if kernel is None:
            from autonorm.ops import layer_norm as codegen
            from autonorm.runtime import compiler
            from autonorm.runtime.device import query_device

            choice = choose_config(problem, rows, device_id)
            rendered = codegen.render(choice.config, problem, query_device(device_id).limits())
            kernel = compiler.compile_kernel(rendered, device_id)
            _CHOICES[key] = choice
            _KERNELS[key] = kernel
    return kernel


def chosen(problem: Problem, rows: int, device_id: int = 0) -> Choice | None:
    """Return what :func:`get_kernel` picked for this key, if it ran."""
    return _CHOICES.get((device_id, problem, rows_bucket(rows)))


def clear_cache() -> None:
    """Forget every compiled kernel and choice (after tuning, so new winners are used)."""
    with _LOCK:
        _KERNELS.clear()
        _CHOICES.clear()


def _dtype_name(array: Any) -> str:
    dtype = getattr(array, "dtype", None)
    try:
        return normalize_dtype(dtype)
    except ValueError:
        raise UnsupportedDtypeError(
            f"unsupported dtype {dtype}: autonorm supports float32, float16 and bfloat16"
        ) from None


def validate(x: Any, weight: Any, bias: Any, eps: float) -> tuple[str, int, int]:
    """Check the arguments of :func:`layer_norm`; return (dtype, rows, hidden).

    Raises:
        InputError: (or a subclass) naming the problem.

    """
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise InputError(f"x must be an array or tensor, got {type(x).__name__}")
    if len(x.shape) < 1:
        raise ShapeError("x must have at least one dimension (..., hidden); got a scalar")
    dtype = _dtype_name(x)
    hidden = int(x.shape[-1])
    if hidden < 1:
        raise ShapeError(f"hidden size (last dimension) must be at least 1, got {hidden}")
    rows = int(np.prod(x.shape[:-1], dtype=np.int64)) if len(x.shape) > 1 else 1
    for name, t in (("weight", weight), ("bias", bias)):
        if t is None:
            continue
        if tuple(t.shape) != (hidden,):
            raise ShapeError(
                f"{name} must have shape ({hidden},) to match x's hidden size, got "
                f"{tuple(t.shape)}"
            )
        if _dtype_name(t) != dtype:
            raise UnsupportedDtypeError(f"{name} dtype {t.dtype} differs from x dtype {x.dtype}")
    if not (isinstance(eps, (int, float, np.floating)) and float(eps) > 0):
        raise InputError(f"eps must be a positive number, got {eps!r}")
    if rows > 2**31 - 1:
        raise ShapeError(f"{rows} rows exceed the kernel's 32-bit row index")
    return dtype, rows, hidden


def layer_norm(x: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5) -> Any:
    """LayerNorm over the last dimension of ``x``: ``(x - mean) / sqrt(var + eps) * w + b``.

    Accepts CuPy arrays (runs the tuned kernel on x's GPU, on CuPy's current stream), torch
    tensors (see :mod:`autonorm.torch`) and NumPy arrays (computed on the CPU in float64 and
    returned in x's dtype, so the API works anywhere).

    Args:
        x: input of shape (..., hidden), float32, float16 or bfloat16.
        weight: optional scale of shape (hidden,), same dtype as x.
        bias: optional shift of shape (hidden,), same dtype as x.
        eps: added to the variance; must be > 0.

    Returns:
        An array of x's shape, dtype and kind.

    Raises:
        autonorm.errors.InputError: bad dtype, shape, device or eps (subclasses name which).

    """
    module = type(x).__module__
    if module.startswith("torch"):
        from autonorm import torch as autonorm_torch

        return autonorm_torch.layer_norm(x, weight, bias, eps)
    if isinstance(x, np.ndarray):
        from autonorm.ops.layer_norm.reference import layer_norm_cpu

        validate(x, weight, bias, eps)
        for t in (weight, bias):
            if t is not None and not isinstance(t, np.ndarray):
                raise DeviceMismatchError("x is a NumPy array: weight and bias must be too")
        return layer_norm_cpu(x, weight, bias, float(eps))
    if not module.startswith("cupy"):
        raise InputError(
            f"x must be a CuPy array, a torch tensor or a NumPy array, got {type(x).__name__}"
        )
    return _layer_norm_cupy(x, weight, bias, eps)


def _layer_norm_cupy(x: Any, weight: Any, bias: Any, eps: Any) -> Any:
    import cupy

    dtype, rows, hidden = validate(x, weight, bias, eps)  # eps checked before any float()
    eps = float(eps)
    device_id = x.device.id
    for name, t in (("weight", weight), ("bias", bias)):
        if t is None:
            continue
        if not isinstance(t, cupy.ndarray):
            raise DeviceMismatchError(f"{name} must be a CuPy array on x's GPU")
        if t.device.id != device_id:
            raise DeviceMismatchError(
                f"{name} is on GPU {t.device.id} but x is on GPU {device_id}"
            )
    problem = Problem(hidden, dtype, weight is not None, bias is not None)
    with cupy.cuda.Device(device_id):
        xc = _aligned_contiguous(x)
        w = None if weight is None else _aligned_contiguous(weight)
        b = None if bias is None else _aligned_contiguous(bias)
        y = cupy.empty(x.shape, dtype=x.dtype)
        if rows == 0:
            return y
        get_kernel(problem, rows, device_id).launch_arrays(xc, w, b, y, rows, eps)
    return y


def _aligned_contiguous(a: Any) -> Any:
    """Return ``a`` C-contiguous and 16-byte aligned (copying only when needed)."""
    import cupy

    if a.flags.c_contiguous and a.data.ptr % 16 == 0:
        return a
    out = cupy.empty(a.shape, dtype=a.dtype)  # CuPy allocations are 256-byte aligned
    out[...] = a
    return out
