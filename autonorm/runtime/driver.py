"""The CUDA driver through ctypes: the kernel launcher, raw streams and occupancy queries.

:class:`_DriverLauncher` calls ``cuLaunchKernel`` directly, which costs a fraction of CuPy's call
path; :func:`resident_clusters` asks the driver how many clusters fit at once, and
:func:`allow_large_clusters` lets a kernel launch clusters past the portable size. Both
:mod:`autonorm.runtime.compiler` and :mod:`autonorm.runtime.workspace` use this module, and it
uses neither. CuPy is imported only where a stream is wrapped.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import threading
from typing import TYPE_CHECKING, Any

from autonorm.runtime.abi import DEFAULT_ABI, KernelABI

if TYPE_CHECKING:
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
    up most of a 13.9 us host cost per autonorm call (H200, torch path) against a 10 us budget.
    Here each thread keeps its own preallocated parameter buffer, laid out by the kernel's
    :class:`~autonorm.runtime.abi.KernelABI`; a call packs every value into it with one
    ``struct`` call, and ``cuLaunchKernel`` is called without ``argtypes``: ctypes' per-argument
    conversion took 0.73 of a 1.16 us call, and seven ``.value`` stores 0.35 us where the pack
    takes 0.26 (timed against a no-op C function in the driver's place). Without argtypes ctypes
    passes Python ints as C ints, which the launch's unsigned dimensions (far below 2^31) read
    correctly, and pointers as ``c_void_p``.

    Args:
        function_ptr: the ``CUfunction`` handle.
        abi: the kernel's parameter list; a launcher made without one packs
            :data:`~autonorm.runtime.abi.DEFAULT_ABI`'s.
    """

    _lib: Any = None
    _cuda: Any = None  # the driver library (for occupancy queries)
    _lib_tried = False

    def __init__(self, function_ptr: int, abi: KernelABI = DEFAULT_ABI) -> None:
        self._fn = ctypes.c_void_p(function_ptr)
        packer = abi.packer
        self._pack = packer.pack_into
        self._words = -(-packer.size // 8)
        self._offsets = abi.offsets
        self._local = threading.local()

    @classmethod
    def create(cls, function: Any, abi: KernelABI = DEFAULT_ABI) -> _DriverLauncher | None:
        """Return a launcher for a CuPy ``Function``, or None where the driver is unreachable."""
        ptr = getattr(function, "ptr", None)
        if not ptr or cls._driver() is None:
            return None
        return cls(int(ptr), abi)

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
            # took 1.3 of the query's 1.8 us, timed against a no-op library).
            lib.cuStreamIsCapturing.restype = ctypes.c_int
            cls._lib = fn
        return cls._lib

    def _buffers(self) -> tuple[Any, Any]:
        """This thread's (parameter buffer, array of pointers into it)."""
        bufs = getattr(self._local, "bufs", None)
        if bufs is None:
            buf = (ctypes.c_uint64 * self._words)()  # 8-byte aligned
            base = ctypes.addressof(buf)
            params = (ctypes.c_void_p * len(self._offsets))(*(base + o for o in self._offsets))
            bufs = self._local.bufs = (buf, params)
        return bufs

    def launch(
        self, grid: int, block: int, smem: int, stream_ptr: int, args: tuple, work: int
    ) -> int:
        """Launch with the kernel's parameters ``args`` and workspace pointer ``work``.

        ``work`` is packed for every kernel (0 for one without a workspace, which never reads
        it): one pack, no branch. Returns the CUresult (0 on success).
        """
        buf, params = self._buffers()
        self._pack(buf, 0, *args, work)
        stream = _STREAM_ARGS.get(stream_ptr)  # a dict lookup: ~40 ns, a call ~100 ns
        if stream is None:
            stream = stream_arg(stream_ptr)
        return self._lib(self._fn, grid, 1, 1, block, 1, 1, smem, stream, params, None)

    def __call__(self, grid: int, block: int, smem: int, stream_ptr: int, *values: Any) -> int:
        """Launch with the values one by one: the parameters, then the workspace pointer."""
        return self.launch(grid, block, smem, stream_ptr, values[:-1], values[-1])


def driver_library() -> Any:
    """The CUDA driver library (ctypes), or None where it cannot be loaded."""
    return _DriverLauncher._cuda if _DriverLauncher._driver() else None  # noqa: SLF001


class _ExecAffinityParam(ctypes.Structure):
    """CUDA's ``CUexecAffinityParam`` with its SM-count member (the union's only one)."""

    _fields_ = [("type", ctypes.c_int), ("sm_count", ctypes.c_uint)]


_EXEC_AFFINITY_SM_COUNT = 0  # CU_EXEC_AFFINITY_TYPE_SM_COUNT


class _DevResource(ctypes.Structure):
    """CUDA's ``CUdevResource`` (resource ABI 1, CUDA 12.4 on), 144 bytes.

    Its type, 92 bytes the driver keeps to itself, then a union of 48 bytes whose SM member
    (``CUdevSmResource``) starts with the SM count.
    """

    _fields_ = [
        ("type", ctypes.c_int), ("_internal", ctypes.c_ubyte * 92),
        ("sm_count", ctypes.c_uint), ("min_partition", ctypes.c_uint),
        ("coscheduled_alignment", ctypes.c_uint), ("_rest", ctypes.c_ubyte * 36),
    ]


_DEV_RESOURCE_TYPE_SM = 1  # CU_DEV_RESOURCE_TYPE_SM


def context_sm_count() -> int | None:
    """SMs the current CUDA context may run on, or None where the driver cannot say.

    An MPS client with a reduced active-thread percentage runs on fewer SMs than the device
    has (``cuCtxGetExecAffinity`` says how many), and so does a green context, which owns a
    share of the device's SMs (``cuCtxGetDevResource``, CUDA 12.4 on). A kernel whose blocks
    wait for each other at a grid barrier must size its grid to these, or the blocks that find
    no SM never arrive and the launch hangs. Where both answer, the fewer count.
    """
    lib = driver_library()
    if not lib:
        return None
    counts = [n for n in (_affinity_sms(lib), _resource_sms(lib)) if n]
    return min(counts) if counts else None


def usable_sm_count(sm_count: int) -> int:
    """``sm_count``, or fewer where the current context may use fewer (:func:`context_sm_count`).

    The device's count stands where the driver cannot say, or says more.
    """
    limit = context_sm_count()
    return min(sm_count, limit) if limit else sm_count


def _affinity_sms(lib: Any) -> int | None:
    """The SM count of the current context's execution affinity (MPS), or None."""
    query = getattr(lib, "cuCtxGetExecAffinity", None)
    if query is None:
        return None
    param = _ExecAffinityParam(_EXEC_AFFINITY_SM_COUNT, 0)
    code = query(ctypes.byref(param), _EXEC_AFFINITY_SM_COUNT)
    return int(param.sm_count) if code == 0 and param.sm_count > 0 else None


def _resource_sms(lib: Any) -> int | None:
    """The SMs of the current context's resources (a green context's share), or None."""
    current = getattr(lib, "cuCtxGetCurrent", None)
    query = getattr(lib, "cuCtxGetDevResource", None)
    if current is None or query is None:
        return None
    context = ctypes.c_void_p(0)
    if current(ctypes.byref(context)) != 0 or not context.value:
        return None
    resource = _DevResource()
    code = query(context, ctypes.byref(resource), _DEV_RESOURCE_TYPE_SM)
    return int(resource.sm_count) if code == 0 and resource.sm_count > 0 else None


class _LaunchConfig(ctypes.Structure):
    """CUDA's ``CUlaunchConfig`` (CUDA 12+), for the occupancy query of cluster kernels."""

    _fields_ = [
        ("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint), ("grid_z", ctypes.c_uint),
        ("block_x", ctypes.c_uint), ("block_y", ctypes.c_uint), ("block_z", ctypes.c_uint),
        ("smem", ctypes.c_uint), ("stream", ctypes.c_void_p), ("attrs", ctypes.c_void_p),
        ("num_attrs", ctypes.c_uint),
    ]


# CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED: a kernel may launch clusters past the
# portable size where the device allows them (16 blocks on Hopper).
_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14


def allow_large_clusters(function: Any) -> bool:
    """Let a kernel launch clusters past the portable 8 blocks; return whether the driver did.

    Without it a launch of a larger cluster, and the occupancy query of one, fail.
    """
    lib = driver_library()
    ptr = getattr(function, "ptr", None)
    if not lib or not ptr:
        return False
    code = lib.cuFuncSetAttribute(
        ctypes.c_void_p(int(ptr)), ctypes.c_int(_NON_PORTABLE_CLUSTER_SIZE_ALLOWED),
        ctypes.c_int(1),
    )
    return code == 0


def resident_clusters(function: Any, plan: LaunchPlan, sm_count: int) -> int | None:
    """Clusters (blocks, without a cluster) of a kernel that can be resident at once, or None.

    Asked of the driver for the current device: for clusters, the GPC layout decides (clusters
    of 4 blocks fit only 30 at a time on a 132-SM H200), which a count of blocks per SM cannot
    tell. None where the driver cannot be asked; the plan then assumes
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
