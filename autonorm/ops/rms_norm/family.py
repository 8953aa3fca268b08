"""RMSNorm forward as a kernel family (:class:`autonorm.ops.base.Family`).

It runs LayerNorm's row and bulk-copy kernels with the RMS statistic, so it inherits their
search space, rules, rendering, launch ABI (``x, weight, bias = 0, y, rows, eps``), workload and
export launcher, and overrides what names or sizes the problem.
"""

from __future__ import annotations

from typing import Any

from autonorm.dtypes import SHORT_DTYPES
from autonorm.ops.layer_norm.family import (  # noqa: F401 - RESIDUAL_ABI: the family's too
    RESIDUAL_ABI,
    LayerNormFamily,
    hidden_octaves,
)
from autonorm.ops.rms_norm.problem import Problem


class RMSNormFamily(LayerNormFamily):
    """``y = x / sqrt(mean(x^2) + eps) * w`` over each row (``w`` may be ``1 + weight``)."""

    op = "rms_norm"
    problem_type = Problem
    # No release before kernel digests had this family: no migrated winner to trust.
    legacy_versions: frozenset[str] = frozenset()

    def problem(self, **fields: Any) -> Problem:
        """Build a problem from its fields (hidden, dtype, has_weight, weight_offset, residual)."""
        return Problem(**fields)

    def neighbour_distance(self, problem: Problem, other: Problem) -> float | None:
        """Return how far ``other``'s winners are from ``problem`` in octaves, or None.

        Problems with the same dtype, weight form and residual add (which moves twice the
        bytes, through other caches) lend their winners across hidden sizes less than 2x
        apart, both on the vector grid or both off it
        (:func:`~autonorm.ops.layer_norm.family.hidden_octaves`).
        """
        same = (problem.dtype, problem.has_weight, problem.weight_offset, problem.residual,
                problem.residual_dtype)
        if (other.dtype, other.has_weight, other.weight_offset, other.residual,
                other.residual_dtype) != same:
            return None
        return hidden_octaves(problem, other)

    def export_basename(self, problem: Problem) -> str:
        """Return the default file stem of an export, e.g. ``autonorm_rms_bf16_h4096``."""
        name = f"autonorm_rms_{SHORT_DTYPES[problem.dtype]}_h{problem.hidden}"
        if problem.residual:
            name = name.replace("autonorm_rms_", "autonorm_add_rms_", 1)
        if not problem.has_weight:
            name += "_noweight"
        elif problem.weight_offset:
            name += "_offset"
        if problem.wide_residual:
            name += "_f32res"
        return name


FAMILY = RMSNormFamily()
