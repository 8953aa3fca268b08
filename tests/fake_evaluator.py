"""A CPU-only stand-in for the GPU evaluator: a deterministic fake timer and scripted failures.

Importable by spawned worker processes (pytest puts ``tests/`` on ``sys.path`` and
multiprocessing's spawn passes ``sys.path`` on), so :func:`tune_worker` can run in them.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.problem import Problem
from autonorm.results import Outcome, Timing
from autonorm.runtime.limits import H200
from autonorm.tune.search import TuneSettings, tune
from autonorm.tune.storage import open_storage

# Bytes a 1024-row bfloat16 LayerNorm of hidden 4096 moves (x read + y written), for GB/s.
BYTES_MOVED = 2 * 1024 * 4096 * 2
COPY_GBPS = 4000.0
CACHE_COST = {"registers": 0.0, "smem": 0.5, "none": 1.0, "bulk": 0.25}
PERSISTENT_COST = {0: 0.0, 1: 0.4, 2: 0.2, 4: 0.1, 8: 0.3}
# The bulk-copy kernel (cache="bulk") only: row tiles in flight; two or three are best.
STAGES_COST = {0: 0.0, 1: 0.6, 2: 0.0, 3: 0.05, 4: 0.15, 6: 0.3, 8: 0.45}


def fake_median_us(config: KernelConfig) -> float:
    """Return a deterministic 'time' that favours vec=8, threads=256 and a register cache.

    Knows every cache of the space, the bulk-copy kernel's (with its stages) included: a
    search may propose any of them. A backward configuration (no rows per block, stats,
    cluster or stages; its blocks per SM from 1 to 8) is timed by the fields it has.
    """
    t = 10.0
    t += 1.5 * abs(math.log2(config.vec) - 3)
    t += 1.0 * abs(math.log2(config.threads) - 8)
    t += CACHE_COST[config.cache]
    t += 0.3 * math.log2(getattr(config, "rows_per_block", 1))
    t += 0.2 * (getattr(config, "stats", "") == "welford")
    t += 0.4 * math.log2(getattr(config, "cluster", 1))
    t += PERSISTENT_COST.get(config.blocks_per_sm, 0.25)
    t += STAGES_COST[getattr(config, "stages", 0)]
    return t


def make_timing(median_us: float, cv: float = 0.005) -> Timing:
    """Build a Timing around a median, with GB/s and share of a fake copy bandwidth."""
    gbps = BYTES_MOVED / (median_us * 1e-6) / 1e9
    return Timing(
        median_us=median_us,
        p20_us=median_us * (1 - cv),
        p80_us=median_us * (1 + cv),
        cv=cv,
        gbps=gbps,
        share=gbps / COPY_GBPS,
        samples=50,
    )


class FakeEvaluator:
    """Implements the search's Evaluator protocol without a GPU.

    Args:
        fail: maps a config to a failure class ('compile', 'launch', 'verification') or None.
        sleep_s: seconds each evaluate() sleeps (to exercise the timeout).
        interrupt_at: raise KeyboardInterrupt on this evaluate() call (1-based).
        log_path: append one JSON line per evaluate() call (shared by processes).
        retime_fn: maps a config to (median_us, cv) in the finals; default: the fake timer.
    """

    def __init__(
        self,
        *,
        fail: Callable[[KernelConfig], str | None] | None = None,
        sleep_s: float = 0.0,
        interrupt_at: int | None = None,
        log_path: Path | str | None = None,
        retime_fn: Callable[[KernelConfig], tuple[float, float]] | None = None,
    ) -> None:
        self.fail = fail or (lambda config: None)
        self.sleep_s = sleep_s
        self.interrupt_at = interrupt_at
        self.log_path = Path(log_path) if log_path else None
        self.retime_fn = retime_fn or (lambda config: (fake_median_us(config), 0.005))
        self.calls: list[KernelConfig] = []
        self.spans: list[tuple[float, float]] = []  # (start, end) of each evaluate(), monotonic
        self.prepared: list[list[KernelConfig]] = []
        self.retimed: list[tuple[list[KernelConfig], int]] = []

    def prepare(self, configs: Sequence[KernelConfig]) -> None:
        self.prepared.append(list(configs))

    def evaluate(self, config: KernelConfig) -> Outcome:
        start = time.monotonic()
        try:
            return self._evaluate(config)
        finally:
            self.spans.append((start, time.monotonic()))

    def _evaluate(self, config: KernelConfig) -> Outcome:
        self.calls.append(config)
        if self.log_path is not None:
            log_line(self.log_path, {"event": "evaluate", "config": config.to_dict()})
        if self.interrupt_at is not None and len(self.calls) == self.interrupt_at:
            raise KeyboardInterrupt
        if self.sleep_s:
            time.sleep(self.sleep_s)
        failure = self.fail(config)
        if failure is not None:
            return Outcome(status=failure, error=f"fake {failure} failure of {config.label()}")
        return Outcome(status="ok", timing=make_timing(fake_median_us(config)), max_rel_err=1e-7)

    def retime(self, configs: Sequence[KernelConfig], rounds: int) -> list[Timing]:
        self.retimed.append((list(configs), rounds))
        return [make_timing(*self.retime_fn(config)) for config in configs]


def fake_evaluator_factory(problem: Problem, rows: int) -> FakeEvaluator:  # noqa: ARG001
    """Build a fake evaluator the way :func:`autonorm.tune.session.tune_and_store` asks.

    Module level, so worker processes can unpickle it.
    """
    return FakeEvaluator()


def log_line(path: Path, record: dict) -> None:
    """Append one JSON line; O_APPEND writes this small are atomic across processes."""
    record = {**record, "pid": os.getpid(), "gpu": os.environ.get("CUDA_VISIBLE_DEVICES")}
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def read_log(path: Path) -> list[dict]:
    """Return the JSON lines of a call log."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line]


WORKER_PROBLEM = Problem(hidden=4096, dtype="bfloat16")
WORKER_STUDY = "workers-test"


def tune_worker(worker_index: int, journal: str, log_path: str, n_trials: int) -> None:
    """Run one worker of a shared study: what a CLI worker does, with the fake evaluator."""
    log_line(Path(log_path), {"event": "start", "worker": worker_index})
    tune(
        WORKER_PROBLEM,
        FakeEvaluator(log_path=log_path, sleep_s=0.02),
        limits=H200,
        storage=open_storage(journal, WORKER_STUDY),
        study_name=WORKER_STUDY,
        settings=TuneSettings(n_trials=n_trials, batch=4, finals_top=0, timeout_s=40.0),
        progress=False,
        worker_index=worker_index,
    )
