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

import concurrent.futures
import ctypes
import ctypes.util
import functools
import multiprocessing
import os
import re
import shutil
import struct
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autonorm import workspace
from autonorm.codegen import LaunchPlan, RenderedKernel
from autonorm.errors import CompileError, LaunchError

# 177: variable declared but never referenced; 550: set but never used. The template declares
# the same locals for every variant; some variants leave a few unused.
_DIAG = "177,550"

# Above 48 KiB of dynamic shared memory a kernel must opt in (cudaFuncSetAttribute).
_DEFAULT_SMEM_LIMIT = 48 * 1024


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


def nvrtc_options(arch: str) -> tuple[str, ...]:
    """Return the NVRTC options for ``arch`` (e.g. ``sm_90``)."""
    return ("-std=c++17", f"--gpu-architecture={arch}", f"--diag-suppress={_DIAG}")


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


class CompiledKernel:
    """A loaded kernel and its launch plan; :meth:`launch` takes raw device pointers."""

    def __init__(
        self,
        rendered: RenderedKernel,
        function: Any,
        sm_count: int,
        attributes: dict[str, int] | None = None,
        device_id: int = 0,
    ) -> None:
        """Wrap a CuPy ``Function`` (``RawKernel.kernel``) loaded on GPU ``device_id``."""
        import numpy as np

        self.attributes = dict(attributes or {})
        self.rendered = rendered
        self.name = rendered.name
        self.plan: LaunchPlan = rendered.launch
        self._function = function
        self._sm_count = sm_count
        self._device_id = device_id
        self._block = (self.plan.threads, 1, 1)
        self._smem = self.plan.smem_bytes
        self._np = np
        self._driver = _DriverLauncher.create(function)
        self.resident_clusters = (
            resident_clusters(function, self.plan, sm_count) if self.plan.resident else None
        )
        # (rows, grid, uses_counter) of the last launch that computed its grid.
        self._last_grid: tuple[int, int, bool] = (0, 0, False)

    def grid(self, rows: int) -> int:
        """Blocks launched for ``rows`` rows."""
        return self.plan.grid(rows, self._sm_count, self.resident_clusters)

    def launch(
        self,
        x_ptr: int,
        w_ptr: int,
        b_ptr: int,
        y_ptr: int,
        rows: int,
        eps: float,
        stream_ptr: int | None = None,
        grid: int | None = None,
        work_ptr: int | None = None,
    ) -> None:
        """Launch on raw device pointers (0 for an absent weight or bias).

        Args:
            x_ptr: input, rows x hidden, contiguous, 16-byte aligned.
            w_ptr: weight (hidden,) or 0.
            b_ptr: bias (hidden,) or 0.
            y_ptr: output, like x.
            rows: number of rows.
            eps: added to the variance.
            stream_ptr: CUDA stream handle; None uses CuPy's current stream.
            grid: override the number of blocks (verification uses a small grid to exercise
                the grid-stride loop); must be a multiple of the cluster size.
            work_ptr: the bulk-copy kernel's tile counter (zeroed, not shared with a launch that
                may overlap this one; 0 takes the static schedule); None takes the stream's own
                (:func:`autonorm.workspace.counter_for`). Used only where the launch has tiles
                enough for the dynamic schedule to pay (``LaunchPlan.uses_counter``); other
                launches and other kernels pass none.

        """
        if rows <= 0:
            return
        if grid is None:
            # The last row count's grid and schedule (one tuple, so threads never see a torn
            # one): a hot caller launches the same shape again, and plan.grid costs ~0.2 us.
            last_rows, grid, dynamic = self._last_grid
            if rows != last_rows:
                grid = self.plan.grid(rows, self._sm_count, self.resident_clusters)
                dynamic = self.plan.uses_counter(rows, grid)
                self._last_grid = (rows, grid, dynamic)
        else:
            dynamic = self.plan.uses_counter(rows, grid)
        if not dynamic:
            work_ptr = 0  # few tiles a cluster: the counter gains nothing (DYNAMIC_MIN_TILES)
        elif work_ptr is None:
            if stream_ptr is None:
                import cupy

                counter_stream = cupy.cuda.get_current_stream().ptr
            else:
                counter_stream = stream_ptr
            work_ptr = workspace.counter_for(self._device_id, counter_stream)
        if self._driver is not None and stream_ptr is not None:
            code = self._driver(
                grid, self._block[0], self._smem, stream_ptr, x_ptr, w_ptr, b_ptr, y_ptr, rows,
                eps, work_ptr,
            )
            if code == 0:
                return
            if code not in _RETRY_WITH_CUPY:
                raise LaunchError(
                    f"launch of {self.rendered.config.label()} failed: CUresult {code}"
                )
            # Wrong or no current context on this thread: CuPy's path sets it up.
            self._driver = None
        np = self._np
        stream = None if stream_ptr is None else wrap_stream(stream_ptr)
        args = (
            np.uint64(x_ptr),
            np.uint64(w_ptr),
            np.uint64(b_ptr),
            np.uint64(y_ptr),
            np.int32(rows),
            np.float32(eps),
            np.uint64(work_ptr),
        )
        try:
            self._function((grid, 1, 1), self._block, args, self._smem, stream)
        except Exception as exc:  # noqa: BLE001 - CuPy raises CUDADriverError and others
            raise LaunchError(f"launch of {self.rendered.config.label()} failed: {exc}") from exc

    def launch_arrays(
        self, x: Any, w: Any, b: Any, y: Any, rows: int, eps: float, grid: int | None = None
    ) -> None:
        """Launch on CuPy arrays (weight and bias may be None) on CuPy's current stream."""
        import cupy

        self.launch(
            x.data.ptr,
            0 if w is None else w.data.ptr,
            0 if b is None else b.data.ptr,
            y.data.ptr,
            rows,
            eps,
            cupy.cuda.get_current_stream().ptr,
            grid=grid,
        )


# CUresult codes after which the CuPy path is tried: no current context (201, 6) or a handle of
# another context (400) on this thread.
_RETRY_WITH_CUPY = frozenset({6, 201, 400})

_MODULES: dict[tuple[str, str, int], Any] = {}


def cuda_version() -> int:
    """Return the CUDA runtime version CuPy was built against (e.g. 13000)."""
    import cupy

    return int(cupy.cuda.runtime.runtimeGetVersion())


def compile_kernel(rendered: RenderedKernel, device_id: int | None = None) -> CompiledKernel:
    """Compile (or fetch from the caches) and load a rendered kernel on a GPU.

    Raises:
        CompileError: NVRTC rejected the source.
        autonorm.device.NoGPUError: no GPU or no CuPy.

    """
    from autonorm.device import import_cupy, query_device

    cupy = import_cupy()
    info = query_device(device_id)
    key = (rendered.source_hash, info.arch, cuda_version())
    module = _MODULES.get(key)
    with cupy.cuda.Device(device_id if device_id is not None else cupy.cuda.runtime.getDevice()):
        if module is None:
            try:
                module = cupy.RawModule(code=rendered.source, options=nvrtc_options(info.arch))
                raw = module.get_function(rendered.name)
                _ = raw.attributes  # forces compile + load now, errors surface here
            except cupy.cuda.compiler.CompileException as exc:
                raise CompileError(f"{rendered.config.label()}: {exc}") from exc
            _MODULES[key] = module
        raw = module.get_function(rendered.name)
        if rendered.launch.smem_bytes > _DEFAULT_SMEM_LIMIT:
            raw.max_dynamic_shared_size_bytes = rendered.launch.smem_bytes
        return CompiledKernel(
            rendered, raw.kernel, info.sm_count, raw.attributes,
            device_id=cupy.cuda.runtime.getDevice(),
        )


def _warm_one(source: str, options: tuple[str, ...], name: str) -> str | None:
    """Compile one source in a pool worker so CuPy's disk cache holds it; return the error."""
    import cupy

    try:
        module = cupy.RawModule(code=source, options=options)
        module.get_function(name)
    except Exception as exc:  # noqa: BLE001 - report any compile failure as text
        return str(exc)
    return None


class CompilePool:
    """A pool of processes that compile kernels ahead of their use (warms the disk cache)."""

    def __init__(self, workers: int | None = None) -> None:
        """Start ``workers`` processes (spawned: CUDA does not survive a fork)."""
        self.workers = workers or max(1, min(8, (os.cpu_count() or 2) - 1))
        self._executor = concurrent.futures.ProcessPoolExecutor(
            max_workers=self.workers, mp_context=multiprocessing.get_context("spawn")
        )
        self._futures: dict[str, concurrent.futures.Future[str | None]] = {}

    def submit(self, rendered: RenderedKernel, arch: str) -> None:
        """Start compiling ``rendered`` unless it is already queued or done."""
        if rendered.source_hash in self._futures:
            return
        self._futures[rendered.source_hash] = self._executor.submit(
            _warm_one, rendered.source, nvrtc_options(arch), rendered.name
        )

    def wait(self, rendered: RenderedKernel) -> str | None:
        """Wait for ``rendered``'s compile; return its error text or None."""
        future = self._futures.get(rendered.source_hash)
        if future is None:
            return None
        try:
            return future.result()
        except Exception as exc:  # noqa: BLE001 - a dead worker is a compile failure here
            return f"compile worker failed: {exc}"

    def close(self) -> None:
        """Stop the workers."""
        self._executor.shutdown(wait=False, cancel_futures=True)


@dataclass(frozen=True)
class PtxasReport:
    """Resources of one compiled kernel, from ``ptxas -v``."""

    name: str
    registers: int
    static_smem: int
    stack_frame: int
    spill_stores: int
    spill_loads: int

    @property
    def spills(self) -> bool:
        """True when the kernel uses local memory for spills or a stack frame."""
        return bool(self.spill_stores or self.spill_loads or self.stack_frame)


_FUNC_RE = re.compile(r"Function properties for (\w+)")
_FRAME_RE = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)
_COMPILING_RE = re.compile(r"Compiling entry function '(\w+)'")
_USED_RE = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


def nvcc_path() -> str | None:
    """Return the nvcc executable, or None if it is not installed."""
    return shutil.which("nvcc")


def parse_ptxas(log: str) -> dict[str, PtxasReport]:
    """Parse ``nvcc -Xptxas -v`` output into one report per kernel."""
    frames: dict[str, tuple[int, int, int]] = {}
    used: dict[str, tuple[int, int]] = {}
    current_props = current_entry = None
    for line in log.splitlines():
        if m := _FUNC_RE.search(line):
            current_props = m.group(1)
        elif (m := _FRAME_RE.search(line)) and current_props:
            frames[current_props] = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
        if m := _COMPILING_RE.search(line):
            current_entry = m.group(1)
        elif (m := _USED_RE.search(line)) and current_entry:
            used[current_entry] = (int(m.group(1)), int(m.group(2) or 0))
    reports = {}
    for name, (regs, smem) in used.items():
        frame, st, ld = frames.get(name, (0, 0, 0))
        reports[name] = PtxasReport(name, regs, smem, frame, st, ld)
    return reports


def compile_offline(
    kernels: Sequence[RenderedKernel], arch: str = "sm_90", *, workdir: Path | None = None
) -> dict[str, PtxasReport]:
    """Compile ``kernels`` together with nvcc for ``arch``; no GPU needed.

    The sources are concatenated into one translation unit (every kernel has a unique name and
    its helpers live in a namespace of their own), so a sweep costs one nvcc run.

    Raises:
        CompileError: nvcc is missing or rejected the source (its log is in the message).

    """
    nvcc = nvcc_path()
    if nvcc is None:
        raise CompileError("nvcc not found on PATH: offline compilation needs the CUDA toolkit")
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        src = Path(tmp) / "sweep.cu"
        src.write_text("\n".join(k.source for k in kernels))
        cmd = [
            nvcc, f"-arch={arch}", "-std=c++17", "-cubin", "-Xptxas", "-v",
            f"-diag-suppress={_DIAG}", "-o", str(Path(tmp) / "sweep.cubin"), str(src),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise CompileError(f"nvcc failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
        reports = parse_ptxas(proc.stdout + proc.stderr)
    missing = [k.name for k in kernels if k.name not in reports]
    if missing:
        raise CompileError(f"ptxas reported nothing for {missing[:3]}")
    return reports
