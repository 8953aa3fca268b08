"""Evaluators that crash, hang or fault on purpose, for the tests of autonorm.tune.isolation.

Importable by the spawned worker process (pytest puts ``tests/`` on ``sys.path`` and
multiprocessing's spawn passes ``sys.path`` on), so the factories here can build them there.
The GPU one imports CuPy only when it is built.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from fake_evaluator import FakeEvaluator, log_line

from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.problem import Problem
from autonorm.results import Outcome, Timing
from autonorm.tune.evaluator import GpuEvaluator

# Each scripted misbehaviour has its own configuration (all valid for bf16, hidden 4096).
GOOD = KernelConfig(256, 8, 1, "registers", "two_pass", 1, 0)
OTHER = KernelConfig(512, 8, 1, "registers", "welford", 1, 0)
THIRD = KernelConfig(128, 4, 1, "smem", "welford", 1, 2)
CRASH = KernelConfig(128, 8, 1, "registers", "two_pass", 1, 0)  # the process exits with code 3
HANG = KernelConfig(256, 4, 1, "registers", "two_pass", 1, 0)  # sleeps past any test timeout
FAULT = KernelConfig(256, 8, 1, "smem", "two_pass", 1, 0)  # reports a launch failure
CUDA_RAISE = KernelConfig(256, 8, 1, "none", "welford", 1, 0)  # raises a CUDA-module error
BUG = KernelConfig(512, 8, 1, "smem", "welford", 1, 0)  # raises a plain TypeError

CRASH_EXIT_CODE = 3
HANG_S = 600.0  # past any wait of the tests: a hanging worker is always killed
FAULT_ERROR = "CUDARuntimeError: cudaErrorIllegalAddress: an illegal memory access was encountered"


class FakeCudaError(RuntimeError):
    """Looks like CuPy's CUDA errors to the worker, which classifies errors by module."""


FakeCudaError.__module__ = "cupy_backends.cuda.api.runtime"


class CrashingEvaluator(FakeEvaluator):
    """The fake evaluator of the tuner tests, plus the misbehaviours named above.

    Args:
        log_path: append one JSON line per prepare/evaluate/retime call (with the pid).
        helper: start a long-running helper process, as the compile pool does, and log its pid
            (a killed worker must not leave it behind).
        tame: HANG and BUG behave like any other configuration (for searches, where the
            sampler might propose them).
    """

    copy_gbps = 1234.5

    def __init__(
        self, log_path: str | None = None, helper: bool = False, tame: bool = False
    ) -> None:
        super().__init__()
        self.log = Path(log_path) if log_path else None
        self.tame = tame
        self.helper = None
        if helper:
            self.helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
            self._log("helper", pid_of_helper=self.helper.pid)

    def _log(self, event: str, **fields: object) -> None:
        if self.log is not None:
            log_line(self.log, {"event": event, **fields})

    def prepare(self, configs: Sequence[KernelConfig]) -> None:
        self._log("prepare", configs=[c.to_dict() for c in configs])
        super().prepare(configs)

    def evaluate(self, config: KernelConfig) -> Outcome:
        self._log("evaluate", config=config.to_dict())
        if config == CRASH:
            os._exit(CRASH_EXIT_CODE)
        if config == HANG and not self.tame:
            time.sleep(HANG_S)
        if config == FAULT:
            return Outcome("launch", error=FAULT_ERROR)
        if config == CUDA_RAISE:
            raise FakeCudaError("cudaErrorLaunchFailure: unspecified launch failure")
        if config == BUG and not self.tame:
            raise TypeError("a bug in the evaluator, not in the candidate")
        return super().evaluate(config)

    def retime(self, configs: Sequence[KernelConfig], rounds: int) -> list[Timing]:
        self._log("retime", configs=[c.to_dict() for c in configs], rounds=rounds)
        if CRASH in configs:
            os._exit(CRASH_EXIT_CODE)
        return super().retime(configs, rounds)

    def close(self) -> None:
        """End the helper process, as GpuEvaluator's pool is closed."""
        if self.helper is not None:
            self.helper.kill()
            self.helper.wait()


def build_crashing(
    log_path: str | None = None, helper: bool = False, tame: bool = False
) -> CrashingEvaluator:
    """Factory for IsolatedEvaluator (module level, so the spawned worker can import it)."""
    return CrashingEvaluator(log_path=log_path, helper=helper, tame=tame)


class SlowClosingEvaluator(CrashingEvaluator):
    """Takes ``close_s`` seconds to close, as a worker does that waits for its compiles."""

    def __init__(self, log_path: str | None, close_s: float) -> None:
        super().__init__(log_path=log_path)
        self.close_s = close_s

    def close(self) -> None:
        self._log("closing")
        time.sleep(self.close_s)
        super().close()


def build_slow_closing(log_path: str | None, close_s: float) -> SlowClosingEvaluator:
    """Factory for IsolatedEvaluator: a worker slow to stop when asked."""
    return SlowClosingEvaluator(log_path, close_s)


def build_broken(message: str) -> CrashingEvaluator:
    """A factory that fails, as GpuEvaluator does without a GPU."""
    raise RuntimeError(message)


def evaluate_and_exit_without_close(log_path: str) -> None:
    """What a CLI tuning process does: build an IsolatedEvaluator, use it, never close it."""
    from autonorm.tune.isolation import IsolatedEvaluator

    evaluator = IsolatedEvaluator(build_crashing, (log_path,))
    assert evaluator.evaluate(GOOD).ok
    # Still referenced at exit, as when sys.exit() is called with the evaluator in scope.
    _UNCLOSED.append(evaluator)


_UNCLOSED: list = []


# --------------------------------------------------------------------------- a real GPU fault

STORE = "store_vec(yr + (size_t)j * V, pack(o));"
# 2^47 elements past y: 2^48 bytes or more, beyond any address the process or the GPU maps
# (user space ends at 2^47 on x86-64, and CUDA places device memory inside it).
FAULTY_STORE = "store_vec(yr + (size_t)j * V + ((size_t)1 << 47), pack(o));"


def faulting_source(source: str) -> str:
    """Return ``source`` with its output store moved far out of bounds (it must fault)."""
    if source.count(STORE) != 1:
        raise ValueError(f"expected exactly one {STORE!r} in the kernel source")
    return source.replace(STORE, FAULTY_STORE)


class FaultingGpuEvaluator(GpuEvaluator):
    """A GpuEvaluator whose kernel for one configuration writes to an unmapped address."""

    def __init__(self, problem: Problem, rows: int, bad: KernelConfig) -> None:
        super().__init__(problem, rows)
        self.bad = bad

    def _render(self, config: KernelConfig):  # noqa: ANN202 - codegen.RenderedKernel
        import dataclasses

        rendered = super()._render(config)
        if config != self.bad:
            return rendered
        return dataclasses.replace(rendered, source=faulting_source(rendered.source))


def build_faulting_gpu_evaluator(
    problem: Problem, rows: int, bad: KernelConfig
) -> FaultingGpuEvaluator:
    """Factory for IsolatedEvaluator: a real GPU evaluator with one faulting configuration."""
    return FaultingGpuEvaluator(problem, rows, bad)
