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
import multiprocessing
import os
from typing import Any

from autonorm.codegen.kernel import LaunchPlan, RenderedKernel
from autonorm.errors import CompileError, LaunchError
from autonorm.runtime import workspace
from autonorm.runtime.driver import (
    _RETRY_WITH_CUPY,
    _DriverLauncher,
    resident_clusters,
    wrap_stream,
)

# 177: variable declared but never referenced; 550: set but never used. The template declares
# the same locals for every variant; some variants leave a few unused.
_DIAG = "177,550"

# Above 48 KiB of dynamic shared memory a kernel must opt in (cudaFuncSetAttribute).
_DEFAULT_SMEM_LIMIT = 48 * 1024


def nvrtc_options(arch: str) -> tuple[str, ...]:
    """Return the NVRTC options for ``arch`` (e.g. ``sm_90``)."""
    return ("-std=c++17", f"--gpu-architecture={arch}", f"--diag-suppress={_DIAG}")


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

_MODULES: dict[tuple[str, str, int], Any] = {}


def cuda_version() -> int:
    """Return the CUDA runtime version CuPy was built against (e.g. 13000)."""
    import cupy

    return int(cupy.cuda.runtime.runtimeGetVersion())


def compile_kernel(rendered: RenderedKernel, device_id: int | None = None) -> CompiledKernel:
    """Compile (or fetch from the caches) and load a rendered kernel on a GPU.

    Raises:
        CompileError: NVRTC rejected the source.
        autonorm.runtime.device.NoGPUError: no GPU or no CuPy.

    """
    from autonorm.runtime.device import import_cupy, query_device

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
