"""Compile rendered kernels: NVRTC through CuPy at run time, nvcc offline.

Run time: :func:`compile_kernel` builds a :class:`CompiledKernel` with ``cupy.RawModule``.
Modules are cached in this process (keyed by source hash, arch and CUDA version) and on disk by
CuPy's kernel cache (``CUPY_CACHE_DIR``, keyed by source, options, arch and NVRTC version), so a
second process loads the cubin instead of compiling again. :func:`precompile` warms that disk
cache from a pool of processes, so a tuner's GPU does not wait on NVRTC.

Offline: :func:`compile_offline` compiles many kernels for a named arch with nvcc on a machine
without a GPU and reports registers, shared memory and spills from ``-Xptxas -v``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import struct
import threading
from typing import Any

from autonorm.codegen.kernel import LaunchPlan


class _RawStream:
    """A raw ``cudaStream_t`` presented through the CUDA stream protocol (``__cuda_stream__``)."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.ptr)


@functools.lru_cache(maxsize=64)
def wrap_stream(ptr: int) -> Any:
    """Return a CuPy stream object for a raw ``cudaStream_t`` someone else owns (torch's, say).

    CuPy 14 deprecates ``cupy.cuda.ExternalStream`` (removal is planned for 15) in favour of
    ``Stream.from_external`` on any object with ``__cuda_stream__``; older CuPy has only the
    former. Either way the stream is not destroyed when the wrapper is. One wrapper per stream
    (the last 64 kept), so callers that launch on a stream again need no cache of their own.
    """
    import cupy

    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is not None:
        return from_external(_RawStream(ptr))
    return cupy.cuda.ExternalStream(ptr)

# The kernel's parameters as cuLaunchKernel reads them, each through its own pointer: x, w, b, y,
# rows (int), eps (float), work, packed at their natural alignment by one struct call.
_PARAMS = struct.Struct("=QQQQifQ")

_PARAM_OFFSETS = (0, 8, 16, 24, 32, 36, 40)

# ctypes' c_void_p of each CUDA stream handle the driver is called with, shared by the launcher
# and workspace's capture query: a c_void_p built per call costs ~0.2 us. Bounded: a caller that
# makes a new stream for every call must not grow it without end.
_STREAM_ARGS: dict[int, ctypes.c_void_p] = {}


def stream_arg(stream_ptr: int) -> ctypes.c_void_p:
    """The cached ``c_void_p`` of a stream handle (the slow path of a ``_STREAM_ARGS`` lookup)."""
    stream = _STREAM_ARGS.get(stream_ptr)
    if stream is None:
        if len(_STREAM_ARGS) >= 64:
            _STREAM_ARGS.clear()
        stream = _STREAM_ARGS[stream_ptr] = ctypes.c_void_p(stream_ptr)
    return stream


class _DriverLauncher:
    """Launch one kernel through ``cuLaunchKernel`` directly (ctypes), skipping CuPy's call path.

    CuPy's ``Function.__call__`` builds its argument buffer on every call; at rows=1 that made
    up most of a 13.9 us host cost per autonorm call (H200, torch path, 2026-11-29) against a
    10 us budget. Here each thread keeps its own preallocated parameter buffer, a call packs the
    seven values into it with one ``struct`` call, and ``cuLaunchKernel`` is called without
    ``argtypes``: ctypes' per-argument conversion took 0.73 of a 1.16 us call, and seven
    ``.value`` stores 0.35 us where the pack takes 0.26 (dev machine, a no-op C function in its
    place, 2026-11-30). Without argtypes ctypes passes Python ints as C ints, which the
    launch's unsigned dimensions (far below 2^31) read correctly, and pointers as ``c_void_p``.
    """

    _lib: Any = None
    _cuda: Any = None  # the driver library (for occupancy queries)
    _lib_tried = False

    def __init__(self, function_ptr: int) -> None:
        self._fn = ctypes.c_void_p(function_ptr)
        self._local = threading.local()

    @classmethod
    def create(cls, function: Any) -> _DriverLauncher | None:
        """Return a launcher for a CuPy ``Function``, or None where the driver is unreachable."""
        ptr = getattr(function, "ptr", None)
        if not ptr or cls._driver() is None:
            return None
        return cls(int(ptr))

    @classmethod
    def _driver(cls) -> Any:
        if not cls._lib_tried:
            cls._lib_tried = True
            name = ctypes.util.find_library("cuda") or "libcuda.so.1"
            try:
                lib = ctypes.CDLL(name)
                fn = lib.cuLaunchKernel
            except OSError:
                return None
            cls._cuda = lib
            fn.restype = ctypes.c_int  # no argtypes: see the class docstring
            # No argtypes here either: workspace passes ready ctypes objects (the conversion
            # took 1.3 of the query's 1.8 us on the dev machine, against a no-op library).
            lib.cuStreamIsCapturing.restype = ctypes.c_int
            cls._lib = fn
        return cls._lib

    def _buffers(self) -> tuple[Any, Any]:
        """This thread's (parameter buffer, array of pointers into it)."""
        bufs = getattr(self._local, "bufs", None)
        if bufs is None:
            buf = (ctypes.c_uint64 * (_PARAMS.size // 8))()  # 8-byte aligned
            base = ctypes.addressof(buf)
            params = (ctypes.c_void_p * len(_PARAM_OFFSETS))(*(base + o for o in _PARAM_OFFSETS))
            bufs = self._local.bufs = (buf, params)
        return bufs

    def __call__(
        self, grid: int, block: int, smem: int, stream_ptr: int,
        x: int, w: int, b: int, y: int, rows: int, eps: float, work: int,
    ) -> int:
        """Launch; return the CUresult (0 on success)."""
        buf, params = self._buffers()
        _PARAMS.pack_into(buf, 0, x, w, b, y, rows, eps, work)
        stream = _STREAM_ARGS.get(stream_ptr)  # a dict lookup: ~40 ns, a call ~100 ns
        if stream is None:
            stream = stream_arg(stream_ptr)
        return self._lib(self._fn, grid, 1, 1, block, 1, 1, smem, stream, params, None)


def driver_library() -> Any:
    """The CUDA driver library (ctypes), or None where it cannot be loaded."""
    return _DriverLauncher._cuda if _DriverLauncher._driver() else None  # noqa: SLF001


class _LaunchConfig(ctypes.Structure):
    """CUDA's ``CUlaunchConfig`` (CUDA 12+), for the occupancy query of cluster kernels."""

    _fields_ = [
        ("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint), ("grid_z", ctypes.c_uint),
        ("block_x", ctypes.c_uint), ("block_y", ctypes.c_uint), ("block_z", ctypes.c_uint),
        ("smem", ctypes.c_uint), ("stream", ctypes.c_void_p), ("attrs", ctypes.c_void_p),
        ("num_attrs", ctypes.c_uint),
    ]


def resident_clusters(function: Any, plan: LaunchPlan, sm_count: int) -> int | None:
    """Clusters (blocks, without a cluster) of a kernel that can be resident at once, or None.

    Asked of the driver for the current device: for clusters, the GPC layout decides (clusters
    of 4 blocks fit only 30 at a time on a 132-SM H200, measured 2026-11-29), which a count of
    blocks per SM cannot tell. None where the driver cannot be asked; the plan then assumes
    ``blocks_per_sm`` blocks on every SM.
    """
    lib = driver_library()
    ptr = getattr(function, "ptr", None)
    if not lib or not ptr:
        return None
    count = ctypes.c_int(0)
    if plan.cluster > 1:
        cfg = _LaunchConfig(plan.cluster, 1, 1, plan.threads, 1, 1, plan.smem_bytes)
        code = lib.cuOccupancyMaxActiveClusters(
            ctypes.byref(count), ctypes.c_void_p(int(ptr)), ctypes.byref(cfg)
        )
        return count.value if code == 0 and count.value > 0 else None
    code = lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(
        ctypes.byref(count), ctypes.c_void_p(int(ptr)), plan.threads,
        ctypes.c_size_t(plan.smem_bytes),
    )
    if code != 0 or count.value <= 0:
        return None
    return count.value * sm_count

# CUresult codes after which the CuPy path is tried: no current context (201, 6) or a handle of
# another context (400) on this thread.
_RETRY_WITH_CUPY = frozenset({6, 201, 400})
