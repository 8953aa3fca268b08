"""PyTorch integration: :func:`layer_norm`, a drop-in :class:`LayerNorm` module, torch.compile.

Everything here takes and returns ``torch.Tensor`` and never copies data between libraries: the
autonorm kernel reads and writes torch's own memory through ``data_ptr()`` and runs on torch's
current CUDA stream, so it is ordered with the surrounding torch work and can be captured in a
CUDA graph. CPU (and any non-CUDA) tensors are computed with ``torch.nn.functional.layer_norm``,
so the same code runs anywhere.

Three ways in, cheapest first:

* eager inference (no gradient needed, not compiling): validate, allocate the output, launch.
  The kernel object is cached per (device, dtype, hidden, affine flags, rows bucket) in this
  module, so a hot call is a few attribute reads, one allocation and the launch.
* autograd or ``torch.compile``: the custom op ``torch.ops.autonorm.layer_norm``, which has a fake
  (meta) implementation for tracing, an autograd formula written in PyTorch ops and an autocast
  rule, so compiled graphs contain it without graph breaks.
* tensor subclasses and active dispatch modes (FakeTensor, make_fx, FlopCounterMode): the custom
  op too, so they see the operator instead of a raw kernel launch.

PyTorch is an optional dependency (``pip install 'autonorm[torch]'``); ``import autonorm`` never
imports this module.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Sequence

try:
    import torch
    import torch.nn.functional as F  # noqa: N812 - the conventional alias
    from torch import nn
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "autonorm.torch needs PyTorch: install it, e.g. pip install 'autonorm[torch]'"
    ) from exc

from autonorm.errors import DeviceMismatchError, InputError, ShapeError, UnsupportedDtypeError
from autonorm.ops.layer_norm.problem import Problem

__all__ = ["LayerNorm", "clear_kernel_cache", "layer_norm", "replace_layer_norms"]

# torch dtype -> autonorm dtype name; membership is the dtype check.
_DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
}

# (device index, torch dtype, hidden, has_weight, has_bias, rows bucket) -> compiled kernel.
# The dispatcher caches too, but building its Problem key costs more than this tuple.
_KERNELS: dict[tuple[int, torch.dtype, int, bool, bool, int], object] = {}

_Tensor = torch.Tensor
_is_compiling = torch.compiler.is_compiling
_is_grad_enabled = torch.is_grad_enabled
_is_autocast_enabled = torch.is_autocast_enabled
# Any autocast at all (one C call), so the common no-autocast case skips the per-device query.
_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", None) or (
    lambda: _is_autocast_enabled("cuda") or _is_autocast_enabled("cpu")
)
# Number of active TorchDispatchModes (make_fx, FlopCounterMode, ...): they must see the op.
_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", None) or (lambda: 0)


def _raw_stream_fallback(index: int) -> int:
    return torch.cuda.current_stream(index).cuda_stream


# The raw cudaStream_t of torch's current stream on a device, without building a Stream object
# (inductor's get_raw_stream). CPU-only builds lack it; they never launch anyway.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or _raw_stream_fallback
# The CUDA runtime's current device (cudaGetDevice, shared by torch and CuPy).
_current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device


def clear_kernel_cache() -> None:
    """Forget the kernels cached by this module (the dispatcher keeps its own cache)."""
    _KERNELS.clear()


def _check_param(p: object, name: str, x: torch.Tensor, hidden: int) -> None:
    """Raise unless ``p`` is a 1-D tensor of ``hidden`` elements, x's dtype, on x's device."""
    if not isinstance(p, torch.Tensor):
        raise InputError(f"{name} must be a torch.Tensor or None, got {type(p).__name__}")
    if p.dim() != 1 or p.shape[0] != hidden:
        raise ShapeError(
            f"{name} must be 1-D with hidden={hidden} elements (the last dimension of x, shape "
            f"{tuple(x.shape)}), got shape {tuple(p.shape)}"
        )
    if p.dtype != x.dtype:
        raise UnsupportedDtypeError(
            f"{name} has dtype {p.dtype} but x has dtype {x.dtype}: they must be the same"
        )
    if p.device != x.device:
        raise DeviceMismatchError(f"{name} is on {p.device} but x is on {x.device}")


def _as_float(eps: object) -> float:
    """Return eps as a float for the op's schema, raising InputError where a TypeError would."""
    if type(eps) is float:
        return eps
    # bool is an int, but True or False as eps is surely a mistake.
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise InputError(f"eps must be a positive number, got {eps!r}")
    return float(eps)


def _validate(
    x: object, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: object
) -> int:
    """Check the arguments of :func:`layer_norm` and return the hidden size.

    Raises:
        InputError: x is not a tensor, or eps is not a positive number.
        UnsupportedDtypeError: a dtype is not float32/float16/bfloat16, or the dtypes differ.
        ShapeError: x is 0-d, or weight/bias is not 1-D of size hidden.
        DeviceMismatchError: weight or bias is not on x's device.

    """
    if not isinstance(x, torch.Tensor):
        raise InputError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _DTYPE_NAMES:
        raise UnsupportedDtypeError(
            f"x has dtype {x.dtype}: autonorm supports float32, float16 and bfloat16"
        )
    if x.dim() == 0:
        raise ShapeError("x must have shape (..., hidden), got a 0-d tensor")
    hidden = x.shape[-1]
    if weight is not None:
        _check_param(weight, "weight", x, hidden)
    if bias is not None:
        _check_param(bias, "bias", x, hidden)
    # `not eps > 0` also rejects NaN.
    if not _as_float(eps) > 0:
        raise InputError(f"eps must be > 0, got {eps!r}")
    return hidden


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """Return ``t`` if it is contiguous and 16-byte aligned, else an aligned contiguous copy.

    The kernel does 16-byte vector accesses; torch's allocator returns 512-byte aligned blocks,
    so only views with a storage offset (slices) need the copy.
    """
    if not t.is_contiguous():
        t = t.contiguous()
    if t.data_ptr() & 15:
        t = t.clone()
    return t


def _fetch_kernel(key: tuple, rows: int, device_id: int) -> object:
    """Look a kernel up in the dispatcher (tuning DB, compile, load) and cache it here."""
    from autonorm.dispatch import get_kernel

    _, dtype, hidden, has_weight, has_bias, _ = key
    problem = Problem(int(hidden), _DTYPE_NAMES[dtype], has_weight, has_bias)
    kernel = get_kernel(problem, rows, device_id)
    _KERNELS[key] = kernel
    return kernel


def _cached_or_fetched(key: tuple, rows: int, device_id: int) -> object:
    """Return the cached kernel for ``key``, fetching it from the dispatcher on a miss."""
    kernel = _KERNELS.get(key)
    return _fetch_kernel(key, rows, device_id) if kernel is None else kernel


def _launch_cold(key: tuple, args: tuple, device_id: int) -> None:
    """Launch when the kernel is not cached yet or x's device is not the current one."""
    if device_id == _current_device():
        _cached_or_fetched(key, args[4], device_id).launch(*args)
        return
    # Kernels are loaded per device context: make x's device current for torch and CuPy alike
    # (both drive the CUDA runtime's current device) while fetching and launching.
    import cupy

    with torch.cuda.device(device_id), cupy.cuda.Device(device_id):
        _cached_or_fetched(key, args[4], device_id).launch(*args)


def _affine_fits(t: torch.Tensor | None, dtype: torch.dtype, hidden: int, device_id: int) -> bool:
    """Fast-path check of a weight or bias: absent, or (hidden,) of x's dtype on x's GPU."""
    return t is None or (
        t.dtype is dtype and t.shape == (hidden,) and t.get_device() == device_id and t.is_cuda
    )


def _forward_cuda(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
) -> torch.Tensor:
    """Run the autonorm kernel on CUDA tensors: no autograd, no dispatch, returns a new tensor.

    The hot path (kernel cached, x's device current) is written out flat: every attribute read
    here costs ~50-100 ns and a call whose kernel is cached should stay within a few µs.
    """
    dtype = x.dtype
    shape = x.shape
    device_id = x.get_device()
    hidden = shape[-1] if shape else 0
    # Cheap checks of the common case; anything unusual goes to _validate, which raises an
    # error naming the problem (or accepts it: an int eps, say).
    if not (
        dtype in _DTYPE_NAMES
        and shape
        and type(eps) is float
        and eps > 0
        and _affine_fits(weight, dtype, hidden, device_id)
        and _affine_fits(bias, dtype, hidden, device_id)
    ):
        _validate(x, weight, bias, eps)
    # Aligned copies stay referenced until the launch is enqueued: freeing one earlier could
    # hand its block to y. Later reuse is safe: the allocator orders it on the current stream,
    # which is the stream the kernel runs on.
    # Each data pointer is read once (~80 ns a read) and reused for the launch.
    xp = x.data_ptr()
    if xp & 15 or not x.is_contiguous():
        x = _aligned(x)
        xp = x.data_ptr()
    wp = bp = 0
    if weight is not None:
        wp = weight.data_ptr()
        if wp & 15 or not weight.is_contiguous():
            weight = _aligned(weight)
            wp = weight.data_ptr()
    if bias is not None:
        bp = bias.data_ptr()
        if bp & 15 or not bias.is_contiguous():
            bias = _aligned(bias)
            bp = bias.data_ptr()
    y = torch.empty_like(x)  # x is contiguous now, so y is too
    rows = x.numel() // hidden if hidden else 0
    if rows == 0:
        return y
    bucket = 1 if rows <= 1 else 1 << (rows - 1).bit_length()  # space.rows_bucket, inlined
    key = (device_id, dtype, hidden, weight is not None, bias is not None, bucket)
    args = (xp, wp, bp, y.data_ptr(), rows, float(eps), _raw_stream(device_id))
    kernel = _KERNELS.get(key)
    if kernel is not None and device_id == _current_device():
        kernel.launch(*args)
    else:
        _launch_cold(key, args, device_id)
    return y


def _forward_reference(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
) -> torch.Tensor:
    """Compute with torch's own layer_norm (CPU and every non-CUDA device)."""
    hidden = _validate(x, weight, bias, eps)
    # contiguous so the result has the strides the fake implementation promises.
    return F.layer_norm(x.contiguous(), (hidden,), weight, bias, float(eps))


# --------------------------------------------------------------------------------------------
# The custom op: what autograd and torch.compile see.
# --------------------------------------------------------------------------------------------


# An explicit schema: with postponed annotations, inferring it from type hints is fragile.
@torch.library.custom_op(
    "autonorm::layer_norm",
    mutates_args=(),
    schema="(Tensor x, Tensor? weight, Tensor? bias, float eps) -> Tensor",
)
def _layer_norm_op(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
) -> torch.Tensor:
    if x.is_cuda:
        return _forward_cuda(x, weight, bias, eps)
    return _forward_reference(x, weight, bias, eps)


@_layer_norm_op.register_fake
def _layer_norm_fake(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
) -> torch.Tensor:
    # Validating here makes torch.compile report bad inputs at trace time, as eager would.
    _validate(x, weight, bias, eps)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _setup_context(ctx: object, inputs: tuple, output: torch.Tensor) -> None:
    x, weight, bias, eps = inputs
    # Only x (and weight, which autograd keeps alive anyway) are saved: mean and rstd are
    # recomputed in backward, which costs one more read of x but no extra activation memory.
    ctx.save_for_backward(x, weight)
    ctx.eps = eps
    ctx.has_bias = bias is not None


def _backward(ctx: object, grad_y: torch.Tensor) -> tuple:
    """Gradients of y = (x - mean) * rstd * weight + bias, computed in float32."""
    x, weight = ctx.saved_tensors
    needs_x, needs_w, needs_b = ctx.needs_input_grad[:3]
    xf = x.float()
    mean = xf.mean(-1, keepdim=True)
    xc = xf - mean  # two-pass variance: exact enough for offset data, unlike E[x^2] - E[x]^2
    rstd = torch.rsqrt((xc * xc).mean(-1, keepdim=True) + ctx.eps)
    xhat = xc * rstd
    dy = grad_y.float()
    # Weight and bias gradients sum over every leading dim. A 1-D x has none, and sum(())
    # would reduce over all dims instead of none.
    lead = tuple(range(x.dim() - 1))
    grad_x = grad_w = grad_b = None
    if needs_x:
        g = dy if weight is None else dy * weight.float()
        grad_x = rstd * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
        grad_x = grad_x.to(x.dtype)
    if needs_w and weight is not None:
        gw = dy * xhat
        grad_w = (gw.sum(lead) if lead else gw).to(weight.dtype)
    if needs_b and ctx.has_bias:
        grad_b = (dy.sum(lead) if lead else dy).to(x.dtype)
    return grad_x, grad_w, grad_b, None


_layer_norm_op.register_autograd(_backward, setup_context=_setup_context)

# CUDA autocast runs torch's layer_norm in float32 (its fp32 op list); do the same so a replaced
# model keeps the dtypes the original produced, compiled or not. CPU autocast has no such rule
# for layer_norm; the eager wrapper handles it (see _apply_autocast).
if hasattr(torch.library, "register_autocast"):  # torch >= 2.5
    torch.library.register_autocast("autonorm::layer_norm", "cuda", torch.float32)

_OP = torch.ops.autonorm.layer_norm.default


def _apply_autocast(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Cast the arguments the way torch's layer_norm behaves under autocast on x's device.

    CUDA autocast runs layer_norm in float32 (its fp32 op list): cast everything to float32, as
    the op's registered autocast rule also does. CPU autocast leaves layer_norm alone, and torch's
    CPU kernel accepts float32 weights with a bfloat16 x, returning x's dtype: cast weight and bias
    to x's dtype so the output dtype matches (the parameters are rounded to it, the one numerical
    difference). Other devices: unchanged.
    """
    if x.is_cuda:
        if not _is_autocast_enabled("cuda"):
            return x, weight, bias
        dtype = torch.float32
    elif x.device.type == "cpu" and _is_autocast_enabled("cpu") and x.dtype in _DTYPE_NAMES:
        dtype = x.dtype
    else:
        return x, weight, bias

    def cast(t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None or not t.is_floating_point() or t.dtype == dtype:
            return t
        return t.to(dtype)

    return cast(x), cast(weight), cast(bias)


def layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """Normalize the last dimension of ``x`` with the autonorm kernel (zero copy).

    ``y = (x - mean) / sqrt(var + eps) * weight + bias`` over the last dimension, like
    ``torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps)``.

    On CUDA the kernel reads ``x`` in place and writes a new tensor allocated by torch, on torch's
    current stream of ``x``'s device. Non-contiguous inputs are made contiguous first (one copy),
    and so are inputs whose data pointer is not 16-byte aligned (a slice at an odd offset); the
    output is always contiguous. Tensors on other devices (CPU) are computed with
    ``torch.nn.functional.layer_norm``. Under CUDA autocast the computation runs in float32, as
    torch's own layer_norm does (under CPU autocast, weight and bias follow x's dtype). Gradients
    flow to x, weight and bias; ``torch.compile`` sees the custom op
    ``torch.ops.autonorm.layer_norm`` without a graph break.

    The first call for a new (device, dtype, hidden size, affine flags, row-count bucket) looks
    the kernel up in the tuning database and compiles it; do that before capturing a CUDA graph.

    Args:
        x: input of shape (..., hidden); float32, float16 or bfloat16.
        weight: optional scale of shape (hidden,), same dtype and device as x.
        bias: optional shift of shape (hidden,), same dtype and device as x.
        eps: added to the variance; must be > 0.

    Returns:
        A new contiguous tensor of x's shape, dtype and device.

    Raises:
        autonorm.errors.InputError: x is not a tensor, or eps <= 0.
        autonorm.errors.UnsupportedDtypeError: a dtype is unsupported, or the dtypes differ.
        autonorm.errors.ShapeError: x is 0-d, or weight/bias is not (hidden,).
        autonorm.errors.DeviceMismatchError: weight or bias is on another device than x.

    """
    if _is_compiling():
        return _OP(x, weight, bias, eps)
    if type(x) is not _Tensor or _dispatch_modes():
        # Subclasses (Parameter, FakeTensor, DTensor) and dispatch modes go through the op.
        if not isinstance(x, torch.Tensor):
            raise InputError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if _any_autocast():
            x, weight, bias = _apply_autocast(x, weight, bias)
        return _OP(x, weight, bias, _as_float(eps))
    if _any_autocast():
        x, weight, bias = _apply_autocast(x, weight, bias)
    if _is_grad_enabled() and (
        x.requires_grad
        or (weight is not None and weight.requires_grad)
        or (bias is not None and bias.requires_grad)
    ):
        return _OP(x, weight, bias, _as_float(eps))
    if x.is_cuda:
        return _forward_cuda(x, weight, bias, eps)
    return _forward_reference(x, weight, bias, eps)


# --------------------------------------------------------------------------------------------
# The module.
# --------------------------------------------------------------------------------------------


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
        autonorm.errors.InputError: ``model`` itself is a LayerNorm (it cannot be swapped in
            place: use :meth:`LayerNorm.from_torch`).

    """
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
