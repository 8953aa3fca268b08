"""Compile rendered kernels at run time (NVRTC through CuPy) and launch them.

:func:`compile_kernel` builds a :class:`CompiledKernel` with ``cupy.RawModule``. Modules are
cached in this process (keyed by source hash, arch and CUDA version) and on disk by CuPy's
kernel cache (``CUPY_CACHE_DIR``, keyed by source, options, arch and NVRTC version), so a second
process loads the cubin instead of compiling again. :class:`CompilePool` warms that disk cache
from a pool of processes, so a tuner's GPU does not wait on NVRTC. Offline compilation with nvcc
(no GPU) is :mod:`autonorm.runtime.offline`'s.

A compiled kernel knows its family's parameter list (:class:`~autonorm.runtime.abi.KernelABI`,
from ``Family.kernel_abi``) and nothing else of the family: callers pass the parameter values
as one tuple in the kernel's order.
"""

from __future__ import annotations

import concurrent.futures
import functools
import multiprocessing
import os
from typing import TYPE_CHECKING, Any

from autonorm.errors import CompileError, LaunchError
from autonorm.runtime import workspace
from autonorm.runtime.abi import KernelABI
from autonorm.runtime.driver import (
    _RETRY_WITH_CUPY,
    _DriverLauncher,
    allow_large_clusters,
    resident_clusters,
    usable_sm_count,
    wrap_stream,
)

if TYPE_CHECKING:
    from autonorm.codegen.kernel import LaunchPlan, RenderedKernel

# Above 48 KiB of dynamic shared memory a kernel must opt in (cudaFuncSetAttribute).
_DEFAULT_SMEM_LIMIT = 48 * 1024


def nvrtc_options(arch: str) -> tuple[str, ...]:
    """Return the NVRTC options for ``arch`` (e.g. ``sm_90``)."""
    return ("-std=c++17", f"--gpu-architecture={arch}")


class CompiledKernel:
    """A loaded kernel, its launch plan and its parameter list; :meth:`launch` takes raw values.

    Args:
        rendered: the kernel's source and launch plan.
        function: CuPy's ``Function`` (``RawKernel.kernel``), loaded on GPU ``device_id``.
        sm_count: the GPU's SMs (the grid of a persistent kernel follows them).
        abi: the kernel's parameter list (its family's ``kernel_abi``).
        attributes: CuPy's function attributes (registers, local memory, ...).
        device_id: the GPU the function is loaded on.
    """

    def __init__(
        self,
        rendered: RenderedKernel,
        function: Any,
        sm_count: int,
        *,
        abi: KernelABI,
        attributes: dict[str, int] | None = None,
        device_id: int = 0,
    ) -> None:
        self.attributes = dict(attributes or {})
        self.rendered = rendered
        self.name = rendered.name
        self.plan: LaunchPlan = rendered.launch
        self.abi = abi
        self._function = function
        self._sm_count = sm_count
        self._device_id = device_id
        self._threads = self.plan.threads
        self._smem = self.plan.smem_bytes
        self._rows_index = abi.rows_index
        self._driver = _DriverLauncher.create(function, abi)
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
        args: tuple,
        stream_ptr: int | None = None,
        grid: int | None = None,
        work_ptr: int | None = None,
    ) -> None:
        """Launch on raw values, in the order of the kernel's parameter list (its ABI).

        The values are device pointers (16-byte aligned; 0 for an absent tensor), integers and
        floats, in one tuple, not one argument per parameter: a Python call that collects
        ``*args`` or takes a keyword cost ~250 ns more, on a path that must stay within a few
        microseconds.

        Args:
            args: the kernel's parameter values in order, the workspace pointer not among them;
                ``args[abi.rows_index]`` is the row count.
            stream_ptr: CUDA stream handle; None uses CuPy's current stream.
            grid: override the number of blocks (verification uses a small grid to exercise
                the grid-stride loop); must be a multiple of the cluster size.
            work_ptr: for a kernel with a workspace, its tile counter (zeroed, not shared with a
                launch that may overlap this one; 0 takes the static schedule); None takes the
                stream's own (:func:`autonorm.runtime.workspace.counter_for`). Used only where
                the launch has tiles enough for the dynamic schedule to pay
                (``LaunchPlan.uses_counter``); other launches pass none.

        Raises:
            LaunchError: the driver refused the launch.

        """
        rows = args[self._rows_index]
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
        if not dynamic or not self.abi.workspace:
            work_ptr = 0  # few tiles a cluster: the counter gains nothing (DYNAMIC_MIN_TILES)
        elif work_ptr is None:
            if stream_ptr is None:
                import cupy

                counter_stream = cupy.cuda.get_current_stream().ptr
            else:
                counter_stream = stream_ptr
            work_ptr = workspace.counter_for(self._device_id, counter_stream)
        if self._driver is not None and stream_ptr is not None:
            code = self._driver.launch(grid, self._threads, self._smem, stream_ptr, args, work_ptr)
            if code == 0:
                return
            if code not in _RETRY_WITH_CUPY:
                raise LaunchError(
                    f"launch of {self.rendered.config.label()} failed: CUresult {code}"
                )
            # Wrong or no current context on this thread: CuPy's path sets it up.
            self._driver = None
        self._launch_cupy(args, stream_ptr, grid, work_ptr)

    def _launch_cupy(self, args: tuple, stream_ptr: int | None, grid: int, work_ptr: int) -> None:
        """Launch through CuPy's ``Function`` (no driver, another context, or no stream given)."""
        import numpy as np

        values = (*args, work_ptr) if self.abi.workspace else args
        typed = tuple(
            getattr(np, kind)(value)
            for kind, value in zip(self.abi.numpy_types, values, strict=True)
        )
        stream = None if stream_ptr is None else wrap_stream(stream_ptr)
        try:
            self._function((grid, 1, 1), (self._threads, 1, 1), typed, self._smem, stream)
        except Exception as exc:  # noqa: BLE001 - CuPy raises CUDADriverError and others
            raise LaunchError(f"launch of {self.rendered.config.label()} failed: {exc}") from exc

    def launch_arrays(self, *args: Any, grid: int | None = None) -> None:
        """Launch on CuPy arrays and plain values, on CuPy's current stream.

        Each CuPy array stands for its device pointer and None for a null pointer (an absent
        weight, say); other values pass as they are. Not for hot paths: see :meth:`launch`.
        """
        import cupy

        values = tuple(
            0 if a is None else a.data.ptr if isinstance(a, cupy.ndarray) else a for a in args
        )
        self.launch(values, cupy.cuda.get_current_stream().ptr, grid=grid)


_MODULES: dict[tuple[str, str, int], Any] = {}


def cuda_version() -> int:
    """Return the CUDA runtime version CuPy was built against (e.g. 13000)."""
    import cupy

    return int(cupy.cuda.runtime.runtimeGetVersion())


def local_bytes(kernel: Any) -> int:
    """Local memory a thread of a loaded kernel uses (spills or a stack frame), 0 if unknown."""
    return int(getattr(kernel, "attributes", {}).get("local_size_bytes", 0))


def compile_kernel(
    rendered: RenderedKernel, device_id: int | None = None, abi: KernelABI | None = None
) -> CompiledKernel:
    """Compile (or fetch from the caches) and load a rendered kernel on a GPU.

    Args:
        rendered: the kernel.
        device_id: the GPU; None for the current one.
        abi: the kernel's parameter list; None asks the family of ``rendered.problem``
            (``Family.kernel_abi``).

    Raises:
        CompileError: NVRTC rejected the source, or the device launches no cluster of the
            kernel's size.
        autonorm.runtime.device.NoGPUError: no GPU or no CuPy.

    """
    from autonorm.runtime.device import import_cupy, query_device

    if abi is None:
        from autonorm.ops.registry import family_of

        abi = family_of(rendered.problem).kernel_abi(rendered)
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
        # The default cap on dynamic shared memory is 48 KB less the kernel's static shared
        # memory: a launch past it fails (CUDA_ERROR_INVALID_VALUE) unless the cap is raised.
        static = raw.attributes.get("shared_size_bytes", 0)
        if rendered.launch.smem_bytes + static > _DEFAULT_SMEM_LIMIT:
            raw.max_dynamic_shared_size_bytes = rendered.launch.smem_bytes
        cluster = rendered.launch.cluster
        large = rendered.launch.large_cluster
        if large and not allow_large_clusters(raw.kernel):
            raise CompileError(f"{rendered.config.label()}: the driver refused a cluster of "
                               f"{cluster} blocks")
        device = cupy.cuda.runtime.getDevice()
        kernel = CompiledKernel(
            rendered, raw.kernel, usable_sms(device, info.sm_count), abi=abi,
            attributes=raw.attributes, device_id=device,
        )
        if large and kernel.plan.resident and not kernel.resident_clusters:
            # A grid sized without the driver's count could wait at its barrier for a cluster
            # that never becomes resident; the portable sizes fit every device with clusters.
            raise CompileError(f"{rendered.config.label()}: no cluster of {cluster} blocks "
                               "fits this device")
        return kernel


@functools.lru_cache(maxsize=16)
def usable_sms(device_id: int, sm_count: int) -> int:
    """The SMs a grid may count on for ``device_id``: ``sm_count``, or fewer (MPS, green context).

    Asked of the driver once for each device, in the context current then (the device's SM
    count where the driver cannot say, or says more): kernels compiled in the primary context
    and launched later in a green context of fewer SMs keep the whole device's count.
    """
    return usable_sm_count(sm_count)


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
