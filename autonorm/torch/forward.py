"""The forward computations: the autonorm kernels on CUDA tensors, torch's own elsewhere.

:func:`forward_cuda` (LayerNorm) and :func:`forward_rms_cuda` (RMSNorm) are the hot paths. They
launch the kernel that :mod:`autonorm.dispatch` hands out (imported at the first miss), cached
here per (device, dtype, hidden, weight form, rows bucket): building the dispatcher's problem key
costs more than this tuple; the residual-add forwards (:mod:`.residual_forward`) share the caches
and the launch helpers. No autograd and no dispatch happen here; :mod:`.custom_op`, :mod:`.rms_op`,
:mod:`.add_rms_op` and :mod:`.add_ln_op` decide when to come here.

A kernel's launch takes its parameters as one tuple in its family's order
(:meth:`autonorm.runtime.compiler.CompiledKernel.launch`): for LayerNorm and RMSNorm alike x,
weight, bias, y (pointers; RMSNorm's bias pointer is always 0), rows and eps; with the residual
add x, residual, weight, bias, y, h, rows and eps.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F  # noqa: N812 - the conventional alias

from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.rms_norm.problem import Problem as RMSProblem
from autonorm.torch.checks import DTYPE_NAMES, validate, validate_rms

# (device index, torch dtype, hidden, has_weight, has_bias, rows bucket) -> LayerNorm kernel.
_KERNELS: dict[tuple[int, torch.dtype, int, bool, bool, int], object] = {}
# (device index, torch dtype, hidden, has_weight, weight_offset, rows bucket) -> RMSNorm kernel.
_RMS_KERNELS: dict[tuple[int, torch.dtype, int, bool, bool, int], object] = {}
# The same key and the residual's (h's) torch dtype -> residual add + RMSNorm kernel.
_ADD_RMS_KERNELS: dict[tuple[int, torch.dtype, int, bool, bool, int, torch.dtype], object] = {}
# A :data:`_KERNELS` key and the residual's (h's) torch dtype -> residual add + LayerNorm kernel.
_ADD_LN_KERNELS: dict[tuple[int, torch.dtype, int, bool, bool, int, torch.dtype], object] = {}
# (device, dtype, hidden, rms, has_weight, has_bias or weight_offset, rows bucket) -> (backward
# kernel, its problem) (:mod:`.backward_op`).
BACKWARD_KERNELS: dict[tuple, object] = {}


def _raw_stream_fallback(index: int) -> int:
    return torch.cuda.current_stream(index).cuda_stream


# The raw cudaStream_t of torch's current stream on a device, without building a Stream object
# (inductor's get_raw_stream). CPU-only builds lack it; they never launch anyway.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or _raw_stream_fallback
# The CUDA runtime's current device (cudaGetDevice, shared by torch and CuPy).
_current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device


def clear_kernel_cache() -> None:
    """Forget the kernels cached by autonorm.torch (the dispatcher keeps its own cache)."""
    _KERNELS.clear()
    _RMS_KERNELS.clear()
    _ADD_RMS_KERNELS.clear()
    _ADD_LN_KERNELS.clear()
    BACKWARD_KERNELS.clear()


def aligned(t: torch.Tensor) -> torch.Tensor:
    """Return ``t`` if it is contiguous and 16-byte aligned, else an aligned contiguous copy.

    The kernel does 16-byte vector accesses; torch's allocator returns 512-byte aligned blocks,
    so only views with a storage offset (slices) need the copy.
    """
    if not t.is_contiguous():
        t = t.contiguous()
    if t.data_ptr() & 15:
        t = t.clone()
    return t


def _layer_norm_problem(key: tuple) -> Problem:
    """The LayerNorm problem of a :data:`_KERNELS` key."""
    _, dtype, hidden, has_weight, has_bias, _ = key
    return Problem(int(hidden), DTYPE_NAMES[dtype], has_weight, has_bias)


def _rms_norm_problem(key: tuple) -> RMSProblem:
    """The RMSNorm problem of a :data:`_RMS_KERNELS` key."""
    _, dtype, hidden, has_weight, weight_offset, _ = key
    return RMSProblem(int(hidden), DTYPE_NAMES[dtype], has_weight, weight_offset)


def _add_rms_norm_problem(key: tuple) -> RMSProblem:
    """The residual-add RMSNorm problem of an :data:`_ADD_RMS_KERNELS` key.

    A residual dtype other than x's (float32 beside 16-bit x) becomes the problem's
    ``residual_dtype``; the problem drops one equal to x's.
    """
    _, dtype, hidden, has_weight, weight_offset, _, residual_dtype = key
    return RMSProblem(int(hidden), DTYPE_NAMES[dtype], has_weight, weight_offset, residual=True,
                      residual_dtype=DTYPE_NAMES[residual_dtype])


def _add_layer_norm_problem(key: tuple) -> Problem:
    """The residual-add LayerNorm problem of an :data:`_ADD_LN_KERNELS` key.

    Its residual dtype as in :func:`_add_rms_norm_problem`.
    """
    _, dtype, hidden, has_weight, has_bias, _, residual_dtype = key
    return Problem(int(hidden), DTYPE_NAMES[dtype], has_weight, has_bias, residual=True,
                   residual_dtype=DTYPE_NAMES[residual_dtype])


def _cached_or_fetched(
    cache: dict, problem_of: Callable[[tuple], object], key: tuple, rows: int, device_id: int
) -> object:
    """Return the kernel cached for ``key``, else fetch it from the dispatcher and cache it.

    ``problem_of`` turns the key into the dispatcher's problem (only on a miss).
    """
    kernel = cache.get(key)
    if kernel is None:
        from autonorm.dispatch import get_kernel

        kernel = get_kernel(problem_of(key), rows, device_id)
        cache[key] = kernel
    return kernel


def _launch_cold(
    cache: dict,
    problem_of: Callable[[tuple], object],
    key: tuple,
    args: tuple,
    stream: int,
    device_id: int,
    rows_index: int = 4,
) -> None:
    """Launch when the kernel is not cached yet or x's device is not the current one.

    ``args[rows_index]`` is the row count (4 in LayerNorm's parameter list).
    """
    rows = args[rows_index]
    if device_id == _current_device():
        _cached_or_fetched(cache, problem_of, key, rows, device_id).launch(args, stream)
        return
    # Kernels are loaded per device context: make x's device current for torch and CuPy alike
    # (both drive the CUDA runtime's current device) while fetching and launching.
    import cupy

    with torch.cuda.device(device_id), cupy.cuda.Device(device_id):
        _cached_or_fetched(cache, problem_of, key, rows, device_id).launch(args, stream)


def _affine_fits(t: torch.Tensor | None, dtype: torch.dtype, hidden: int, device_id: int) -> bool:
    """Fast-path check of a weight or bias: absent, or (hidden,) of x's dtype on x's GPU."""
    return t is None or (
        t.dtype is dtype and t.shape == (hidden,) and t.get_device() == device_id and t.is_cuda
    )


def forward_cuda(
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
    # Cheap checks of the common case; anything unusual goes to validate, which raises an
    # error naming the problem (or accepts it: an int eps, say).
    if not (
        dtype in DTYPE_NAMES
        and shape
        and type(eps) is float
        and eps > 0
        and _affine_fits(weight, dtype, hidden, device_id)
        and _affine_fits(bias, dtype, hidden, device_id)
    ):
        validate(x, weight, bias, eps)
    # Aligned copies stay referenced until the launch is enqueued: freeing one earlier could
    # hand its block to y. Later reuse is safe: the allocator orders it on the current stream,
    # which is the stream the kernel runs on.
    # Each data pointer is read once (~80 ns a read) and reused for the launch.
    xp = x.data_ptr()
    if xp & 15 or not x.is_contiguous():
        x = aligned(x)
        xp = x.data_ptr()
    wp = bp = 0
    if weight is not None:
        wp = weight.data_ptr()
        if wp & 15 or not weight.is_contiguous():
            weight = aligned(weight)
            wp = weight.data_ptr()
    if bias is not None:
        bp = bias.data_ptr()
        if bp & 15 or not bias.is_contiguous():
            bias = aligned(bias)
            bp = bias.data_ptr()
    y = torch.empty_like(x)  # x is contiguous now, so y is too
    rows = x.numel() // hidden if hidden else 0
    if rows == 0:
        return y
    bucket = 1 if rows <= 1 else 1 << (rows - 1).bit_length()  # ops.base.rows_bucket, inlined
    key = (device_id, dtype, hidden, weight is not None, bias is not None, bucket)
    args = (xp, wp, bp, y.data_ptr(), rows, float(eps))
    stream = _raw_stream(device_id)
    kernel = _KERNELS.get(key)
    if kernel is not None and device_id == _current_device():
        kernel.launch(args, stream)
    else:
        _launch_cold(_KERNELS, _layer_norm_problem, key, args, stream, device_id)
    return y


def forward_reference(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
) -> torch.Tensor:
    """Compute with torch's own layer_norm (CPU and every non-CUDA device)."""
    hidden = validate(x, weight, bias, eps)
    # contiguous so the result has the strides the fake implementation promises.
    return F.layer_norm(x.contiguous(), (hidden,), weight, bias, float(eps))


def forward_rms_cuda(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, weight_offset: bool
) -> torch.Tensor:
    """Run the autonorm RMSNorm kernel on CUDA tensors: no autograd, returns a new tensor.

    The same flat hot path as :func:`forward_cuda`, with one parameter fewer.
    """
    dtype = x.dtype
    shape = x.shape
    device_id = x.get_device()
    hidden = shape[-1] if shape else 0
    if not (
        dtype in DTYPE_NAMES
        and shape
        and type(eps) is float
        and eps > 0
        and _affine_fits(weight, dtype, hidden, device_id)
        and (weight_offset is False or (weight_offset is True and weight is not None))
    ):
        validate_rms(x, weight, eps, weight_offset)
    # As in forward_cuda: aligned copies stay referenced until the launch is enqueued.
    xp = x.data_ptr()
    if xp & 15 or not x.is_contiguous():
        x = aligned(x)
        xp = x.data_ptr()
    wp = 0
    if weight is not None:
        wp = weight.data_ptr()
        if wp & 15 or not weight.is_contiguous():
            weight = aligned(weight)
            wp = weight.data_ptr()
    y = torch.empty_like(x)
    rows = x.numel() // hidden if hidden else 0
    if rows == 0:
        return y
    bucket = 1 if rows <= 1 else 1 << (rows - 1).bit_length()  # ops.base.rows_bucket, inlined
    key = (device_id, dtype, hidden, weight is not None, weight_offset, bucket)
    args = (xp, wp, 0, y.data_ptr(), rows, float(eps))
    stream = _raw_stream(device_id)
    kernel = _RMS_KERNELS.get(key)
    if kernel is not None and device_id == _current_device():
        kernel.launch(args, stream)
    else:
        _launch_cold(_RMS_KERNELS, _rms_norm_problem, key, args, stream, device_id)
    return y


def forward_rms_reference(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, weight_offset: bool
) -> torch.Tensor:
    """Compute RMSNorm with torch's own ops (CPU and every non-CUDA device).

    ``torch.nn.functional.rms_norm`` where it applies; the ``1 + weight`` form has no torch
    function, so it is computed in float32 and rounded once, as the kernel does.
    """
    hidden = validate_rms(x, weight, eps, weight_offset)
    x = x.contiguous()  # the strides the fake implementation promises
    if not weight_offset:
        return F.rms_norm(x, (hidden,), weight, float(eps))
    xf = x.float()
    y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + float(eps))
    return (y * (1.0 + weight.float())).to(x.dtype)

