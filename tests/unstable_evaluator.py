"""A GPU evaluator whose LayerNorm kernels take their statistics without a shift (``naive``).

E[x^2] - E[x]^2 in fp32 loses the variance of rows far from zero, so every kernel it builds
fails verification on the offset rows (fp32: rows of mean 1000 and spread 0.1), whatever the
configuration asked for: a stand-in for a GPU that computes a winner's kernel wrong, for tests
of the paths that verify a kernel again before trusting it (``autonorm db import --verify``).

Importable by the spawned evaluator process (pytest puts ``tests/`` on ``sys.path`` and
multiprocessing's spawn passes ``sys.path`` on); CuPy is imported only when one is built.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from autonorm.ops import layer_norm as codegen
from autonorm.ops.layer_norm.problem import Problem
from autonorm.tune.evaluator import GpuEvaluator


class NaiveStatsEvaluator(GpuEvaluator):
    """The GPU evaluator, rendering each LayerNorm configuration with ``stats="naive"``."""

    def _render(self, config: Any) -> Any:
        rendered = self._rendered.get(config)
        if rendered is None:
            unstable = dataclasses.replace(config, stats="naive")
            rendered = codegen.render(unstable, self.problem, self.limits, allow_unstable=True)
            self._rendered[config] = rendered
        return rendered


def build_naive_stats_evaluator(problem: Problem, rows: int, device_id: int = 0) -> Any:
    """Build a :class:`NaiveStatsEvaluator` (the signature of ``build_gpu_evaluator``)."""
    return NaiveStatsEvaluator(problem, rows, device_id=device_id)
