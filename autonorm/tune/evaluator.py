"""The GPU evaluator: render, compile, verify, then time one candidate of any kernel family.

:class:`GpuEvaluator` implements the tuner's evaluator contract
(:class:`autonorm.tune.search.Evaluator`). A candidate's own failure never raises: it comes back
as an :class:`~autonorm.results.Outcome` with its class.

The evaluator knows a family only through :mod:`autonorm.ops.registry` and the Family protocol:
the family renders a candidate, states its parameter list (for the runtime's launch) and builds
the :class:`Workload`, which holds the GPU inputs, launches a kernel on them and verifies it.
The timing protocol is :mod:`autonorm.runtime.timing`'s, the same for every family.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Protocol

from autonorm.errors import CompileError, ConfigError, LaunchError
from autonorm.ops import registry
from autonorm.ops.base import Config, Problem
from autonorm.results import Outcome, Timing
from autonorm.runtime import compiler, timing


class Verification(Protocol):
    """What verifying one kernel found (a family's verification result)."""

    ok: bool

    @property
    def max_rel_err(self) -> float:
        """The worst relative L2 error over the verification cases."""
        ...

    def summary(self) -> str:
        """One line naming what failed (``ok`` when nothing did)."""
        ...


class Workload(Protocol):
    """A family's GPU inputs for one problem and row count (``Family.workload``).

    Attributes:
        nbytes: bytes one launch must move (GB/s and the share divide by it).
        n_sets: rotated input sets, together more than 3x the L2
            (:func:`autonorm.runtime.timing.rotation_count`); a launch takes one by index.
    """

    nbytes: int
    n_sets: int

    def launch(self, kernel: compiler.CompiledKernel, index: int, stream_ptr: int) -> None:
        """Enqueue one launch of ``kernel`` on input set ``index`` on the given stream."""
        ...

    def verify(self, kernel: compiler.CompiledKernel) -> Verification:
        """Run ``kernel`` on the family's verification cases and check it against float64.

        Raises:
            autonorm.errors.LaunchError: a launch failed (the evaluator classifies it).
        """
        ...


class GpuEvaluator:
    """Evaluates candidates for one problem and row count on one GPU.

    Args:
        problem: what the kernels compute (its family is looked up by its op).
        rows: rows of the timed input.
        device_id: the GPU.
        pool: compiles candidates ahead of their turn (:meth:`prepare`); None compiles here.
        samples: timed batches per back-to-back timing.
        seed: seed of the family's random inputs.
        render: how a candidate becomes a :class:`~autonorm.codegen.kernel.RenderedKernel`
            (default: the family's render of the configuration for this GPU). Candidates are
            then any hashable keys: ``benchmarks/template_ab.py`` times the sources other
            checkouts render for the same configuration, each under a key of its own.
    """

    def __init__(
        self,
        problem: Problem,
        rows: int,
        *,
        device_id: int = 0,
        pool: compiler.CompilePool | None = None,
        samples: int = 25,
        seed: int = 0,
        render: Callable[[Hashable], Any] | None = None,
    ) -> None:
        from autonorm.runtime.device import query_device

        self.problem = problem
        self.rows = rows
        self.device_id = device_id
        self.family = registry.family_of(problem)
        self.info = query_device(device_id)
        self.limits = self.info.limits()
        self.pool = pool
        self.samples = samples
        self.copy_gbps = timing.copy_bandwidth_gbps(device_id)
        self.workload: Workload = self.family.workload(
            problem, rows, device_id=device_id, seed=seed
        )
        self.nbytes = self.workload.nbytes
        self.n_sets = self.workload.n_sets
        self._kernels: dict[Config, Any] = {}
        self._rendered: dict[Config, Any] = {}
        self._render_candidate = render or self._render_config

    def _render_config(self, config: Config) -> Any:
        return self.family.render(config, self.problem, self.limits)

    def _render(self, config: Config) -> Any:
        # prepare() and _compile() both need it: render each candidate once.
        rendered = self._rendered.get(config)
        if rendered is None:
            rendered = self._render_candidate(config)
            self._rendered[config] = rendered
        return rendered

    def prepare(self, configs: Sequence[Config]) -> None:
        """Start compiling ``configs`` in the pool (no-op without a pool)."""
        if self.pool is None:
            return
        for config in configs:
            try:
                self.pool.submit(self._render(config), self.info.arch)
            except ConfigError:
                continue

    def _compile(self, config: Config) -> Any:
        kernel = self._kernels.get(config)
        if kernel is None:
            rendered = self._render(config)
            if self.pool is not None:
                error = self.pool.wait(rendered)
                if error:
                    raise CompileError(error)
            abi = self.family.kernel_abi(rendered)
            kernel = compiler.compile_kernel(rendered, self.device_id, abi)
            self._kernels[config] = kernel
        return kernel

    def _launcher(self, kernel: Any) -> Any:
        """``launch(i, stream_ptr)`` for the timers: one launch of ``kernel`` on set ``i``."""
        return functools.partial(self.workload.launch, kernel)

    def time(self, config: Config, samples: int | None = None) -> Timing:
        """Time an already verified configuration."""
        kernel = self._compile(config)
        return timing.time_launches(
            self._launcher(kernel), self.nbytes, self.n_sets,
            samples=samples or self.samples, copy_gbps=self.copy_gbps,
        )

    def evaluate(self, config: Config) -> Outcome:
        """Compile, verify against float64, then time ``config``."""
        try:
            kernel = self._compile(config)
        except ConfigError as exc:
            return Outcome("invalid", error=str(exc))
        except CompileError as exc:
            return Outcome("compile", error=str(exc)[-2000:])
        # A kernel with local memory (a spill) is verified and timed like any other: on the
        # H200, spilling 16-bit backward defaults at odd sizes ran 2.4-4.5x faster than the
        # spill-free kernels that read the row again (docs/registers.md), so only the timing
        # may turn one away.
        try:
            result = self.workload.verify(kernel)
        except LaunchError as exc:
            return Outcome("launch", error=str(exc))
        except Exception as exc:  # noqa: BLE001 - CUDA errors surface as several types
            return Outcome("launch", error=f"{type(exc).__name__}: {exc}")
        if not result.ok:
            return Outcome("verification", error=result.summary(), max_rel_err=result.max_rel_err)
        try:
            measured = self.time(config)
        except Exception as exc:  # noqa: BLE001
            return Outcome("launch", error=f"{type(exc).__name__}: {exc}")
        return Outcome("ok", timing=measured, max_rel_err=result.max_rel_err)

    def retimes_in_single_launches(self) -> bool:
        """True where the finals time single launches (a launch of at least SINGLE_FROM_S)."""
        return self.nbytes / (self.copy_gbps * 1e9) >= timing.SINGLE_FROM_S

    def time_single(self, config: Config, samples: int = 20) -> Timing:
        """Time an already verified configuration as single launches after an L2 flush.

        Its share is of a copy of the same bytes timed the same way.
        """
        kernel = self._compile(config)
        flush_bytes = timing.FLUSH_L2_MULTIPLE * self.info.l2_bytes
        copy = timing.single_copy_gbps(self.device_id, self.nbytes, flush_bytes)
        return timing.time_single_launches(
            self._launcher(kernel), self.nbytes, self.n_sets, flush_bytes=flush_bytes,
            samples=samples, copy_gbps=copy,
        )

    def retime(self, configs: Sequence[Config], rounds: int) -> list[Timing]:
        """Re-time ``configs`` interleaved (round-robin) ``rounds`` times; median of rounds.

        Problems whose launch takes at least ``timing.SINGLE_FROM_S`` are timed as single
        launches after an L2 flush (see :mod:`autonorm.runtime.timing`); shorter ones back to back.
        The cv is the spread of the rounds' medians; back to back, also at least a round's own
        (a sample there is already a batch's mean), while a single launch's jitter (p20-p80
        about 2.4% at bf16 32768 in the peers' run) says little about a median of 20.
        """
        single = self.retimes_in_single_launches()
        if single:
            time_one = self.time_single
        else:
            def time_one(config: Config) -> Timing:
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
