"""The GPU evaluator: render, compile, verify, then time one candidate.

It implements the tuner's ``Evaluator`` contract (:mod:`autonorm.tuner`). A candidate's own
failure never raises: it comes back as an :class:`~autonorm.results.Outcome` with its class.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from autonorm.errors import CompileError, ConfigError, LaunchError
from autonorm.numerics import from_float64
from autonorm.ops import layer_norm as codegen
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.verify import verify
from autonorm.results import Outcome, Timing
from autonorm.runtime import compiler, workspace
from autonorm.tune import bench


class GpuEvaluator:
    """Evaluates candidates for one problem and row count on one GPU."""

    def __init__(
        self,
        problem: Problem,
        rows: int,
        *,
        device_id: int = 0,
        pool: compiler.CompilePool | None = None,
        samples: int = 25,
        seed: int = 0,
    ) -> None:
        """Allocate rotated inputs for ``rows`` x ``problem.hidden`` and measure copy speed."""
        import cupy
        import numpy as np

        from autonorm.runtime.device import query_device

        self.problem = problem
        self.rows = rows
        self.device_id = device_id
        self.info = query_device(device_id)
        self.limits = self.info.limits()
        self.pool = pool
        self.samples = samples
        self.copy_gbps = bench.copy_bandwidth_gbps(device_id)
        # One tile counter for every launch here, graph-captured ones too (the bulk kernel's
        # dynamic schedule, as dispatch runs it): these launches never overlap.
        self._work = workspace.new_counter(device_id)
        self._kernels: dict[KernelConfig, Any] = {}
        self._rendered: dict[KernelConfig, codegen.RenderedKernel] = {}
        self.nbytes = bench.bytes_moved(
            rows, problem.hidden, problem.itemsize,
            int(problem.has_weight) + int(problem.has_bias),
        )
        per_set = 2 * rows * problem.hidden * problem.itemsize
        self.n_sets = bench.rotation_count(per_set, self.info.l2_bytes)
        rng = np.random.default_rng(seed)
        with cupy.cuda.Device(device_id):
            base = rng.standard_normal((rows, problem.hidden))
            x0 = cupy.asarray(from_float64(base, problem.dtype))
            # Each set is a different permutation of rows: real data, never zeros, cheap to make.
            self._xs = [x0] + [cupy.roll(x0, k + 1, axis=0) for k in range(self.n_sets - 1)]
            self._ys = [cupy.empty_like(x0) for _ in range(self.n_sets)]
            w = from_float64(1.0 + 0.1 * rng.standard_normal(problem.hidden), problem.dtype)
            b = from_float64(0.1 * rng.standard_normal(problem.hidden), problem.dtype)
            self._w = cupy.asarray(w) if problem.has_weight else None
            self._b = cupy.asarray(b) if problem.has_bias else None

    def _render(self, config: KernelConfig) -> codegen.RenderedKernel:
        # prepare() and _compile() both need it: render each candidate once.
        rendered = self._rendered.get(config)
        if rendered is None:
            rendered = self._rendered[config] = codegen.render(config, self.problem, self.limits)
        return rendered

    def prepare(self, configs: Sequence[KernelConfig]) -> None:
        """Start compiling ``configs`` in the pool (no-op without a pool)."""
        if self.pool is None:
            return
        for config in configs:
            try:
                self.pool.submit(self._render(config), self.info.arch)
            except ConfigError:
                continue

    def _compile(self, config: KernelConfig) -> Any:
        kernel = self._kernels.get(config)
        if kernel is None:
            rendered = self._render(config)
            if self.pool is not None:
                error = self.pool.wait(rendered)
                if error:
                    raise CompileError(error)
            kernel = compiler.compile_kernel(rendered, self.device_id)
            self._kernels[config] = kernel
        return kernel

    def _launcher(self, kernel: Any) -> Any:
        wp = 0 if self._w is None else self._w.data.ptr
        bp = 0 if self._b is None else self._b.data.ptr
        xs = [x.data.ptr for x in self._xs]
        ys = [y.data.ptr for y in self._ys]
        rows = self.rows
        work = self._work.data.ptr

        def launch(i: int, stream_ptr: int) -> None:
            kernel.launch(xs[i], wp, bp, ys[i], rows, 1e-5, stream_ptr, work_ptr=work)

        return launch

    def time(self, config: KernelConfig, samples: int | None = None) -> Timing:
        """Time an already verified configuration."""
        kernel = self._compile(config)
        return bench.time_launches(
            self._launcher(kernel), self.nbytes, self.n_sets,
            samples=samples or self.samples, copy_gbps=self.copy_gbps,
        )

    def evaluate(self, config: KernelConfig) -> Outcome:
        """Compile, verify against float64, then time ``config``."""
        try:
            kernel = self._compile(config)
        except ConfigError as exc:
            return Outcome("invalid", error=str(exc))
        except CompileError as exc:
            return Outcome("compile", error=str(exc)[-2000:])
        local = _local_bytes(kernel)
        if local:
            return Outcome("compile", error=f"uses {local} bytes of local memory (spills)")
        try:
            result = verify(kernel, self.problem)
        except LaunchError as exc:
            return Outcome("launch", error=str(exc))
        except Exception as exc:  # noqa: BLE001 - CUDA errors surface as several types
            return Outcome("launch", error=f"{type(exc).__name__}: {exc}")
        if not result.ok:
            return Outcome("verification", error=result.summary(), max_rel_err=result.max_rel_err)
        try:
            timing = self.time(config)
        except Exception as exc:  # noqa: BLE001
            return Outcome("launch", error=f"{type(exc).__name__}: {exc}")
        return Outcome("ok", timing=timing, max_rel_err=result.max_rel_err)

    def retimes_in_single_launches(self) -> bool:
        """True where the finals time single launches (a launch of at least SINGLE_FROM_S)."""
        return self.nbytes / (self.copy_gbps * 1e9) >= bench.SINGLE_FROM_S

    def time_single(self, config: KernelConfig, samples: int = 20) -> Timing:
        """Time an already verified configuration as single launches after an L2 flush.

        Its share is of a copy of the same bytes timed the same way.
        """
        kernel = self._compile(config)
        flush_bytes = bench.FLUSH_L2_MULTIPLE * self.info.l2_bytes
        copy = bench.single_copy_gbps(self.device_id, self.nbytes, flush_bytes)
        return bench.time_single_launches(
            self._launcher(kernel), self.nbytes, self.n_sets, flush_bytes=flush_bytes,
            samples=samples, copy_gbps=copy,
        )

    def retime(self, configs: Sequence[KernelConfig], rounds: int) -> list[Timing]:
        """Re-time ``configs`` interleaved (round-robin) ``rounds`` times; median of rounds.

        Problems whose launch takes at least ``bench.SINGLE_FROM_S`` are timed as single
        launches after an L2 flush (see :mod:`autonorm.bench`); shorter ones back to back.
        The cv is the spread of the rounds' medians; back to back, also at least a round's own
        (a sample there is already a batch's mean), while a single launch's jitter (p20-p80
        about 2.4% at bf16 32768 in the peers' run) says little about a median of 20.
        """
        single = self.retimes_in_single_launches()
        if single:
            time_one = self.time_single
        else:
            def time_one(config: KernelConfig) -> Timing:
                return self.time(config, samples=max(5, self.samples // 3))

        per: list[list[Timing]] = [[] for _ in configs]
        for _ in range(rounds):
            for i, config in enumerate(configs):
                per[i].append(time_one(config))
        out = []
        for timings in per:
            med = statistics.median(t.median_us for t in timings)
            best = min(timings, key=lambda t: abs(t.median_us - med))
            cv = statistics.pstdev([t.median_us for t in timings]) / med if med else 0.0
            gbps = self.nbytes / (med * 1e-6) / 1e9
            out.append(
                Timing(
                    median_us=med,
                    p20_us=min(t.p20_us for t in timings),
                    p80_us=max(t.p80_us for t in timings),
                    cv=cv if single else max(cv, best.cv),
                    gbps=gbps,
                    # of the copy the rounds were divided by (single-launch or back-to-back)
                    share=gbps / best.copy_gbps if best.copy_gbps else 0.0,
                    samples=sum(t.samples for t in timings),
                )
            )
        return out


def _local_bytes(kernel: Any) -> int:
    """Local memory per thread of a loaded kernel (spills or stack), 0 if unknown."""
    return int(kernel.attributes.get("local_size_bytes", 0))
