"""The inputs every backward kernel is verified on, chosen to break wrong kernels.

Random rows (on the launch's own grid, on one block or cluster and on three, so every block
runs the row loop and the column sums meet across blocks), rows far from zero (mean 1000 and
spread 0.1 in fp32) where a sum of x without a shift loses the spread, the same with every
other row's first element (LayerNorm's shift) far above the rest, where sums about the shift
cancel, constant rows (variance zero), and large and tiny magnitudes, each on
:data:`VERIFY_ROWS` rows, a prime. Then one row (its cluster's sums are the totals: no
partials) and :data:`FEW_ROWS` rows (on the launch's grid, which has a block for each tile of
the column sums, so most blocks take no row).

Pure logic: NumPy only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from autonorm.ops.norm_backward.problem import BackwardProblem

VERIFY_ROWS = 37
FEW_ROWS = 3

# Offset rows per dtype (the forward's verification uses the same).
_OFFSET = {"float32": (1000.0, 0.1), "float16": (300.0, 1.0), "bfloat16": (64.0, 4.0)}

# How far (in spreads) the far-shift case puts a row's first element above the rest.
FAR_SHIFT = 100.0

_LARGE = {"float32": 1e4, "float16": 1e3, "bfloat16": 1e4}


@dataclass(frozen=True)
class Case:
    """One verification input.

    Float64 x and dy, the grid to launch on (None: the plan's) and, after a residual add, the
    gradient of the returned h (``dh``).
    """

    name: str
    x: np.ndarray
    dy: np.ndarray
    grid: int | None = None
    dh: np.ndarray | None = None


def make_weight(problem: BackwardProblem, seed: int) -> np.ndarray | None:
    """Return the float64 weight of the checks (near one; an offset weight near zero)."""
    if not problem.has_weight:
        return None
    rng = np.random.default_rng(seed)
    spread = 0.1 * rng.standard_normal(problem.hidden)
    return spread if problem.weight_offset else 1.0 + spread


def make_cases(problem: BackwardProblem, seed: int = 0) -> list[Case]:
    """Return the verification cases of ``problem``."""
    rng = np.random.default_rng(seed)
    shape = (VERIFY_ROWS, problem.hidden)
    normal = rng.standard_normal(shape)
    dy = rng.standard_normal(shape)
    mean, spread = _OFFSET[problem.dtype]
    # A stream of its own, so the other cases keep their inputs.
    far_rng = np.random.default_rng(seed + 11)
    far = mean + spread * far_rng.standard_normal(shape)
    far[::2, 0] += FAR_SHIFT * spread
    constant = np.repeat(rng.uniform(-2.0, 2.0, (VERIFY_ROWS, 1)), problem.hidden, axis=1)
    cases = [
        Case("normal", normal, dy),
        Case("normal-one-block", normal, dy, grid=1),
        Case("normal-three-blocks", normal, dy, grid=3),
        Case("offset", mean + spread * rng.standard_normal(shape), rng.standard_normal(shape)),
        # dy with a mean: sum(g) is large, so sum((x - mean) * g) cancels about the shift too.
        Case("offset-far-shift", far, 1.0 + far_rng.standard_normal(shape)),
        Case("constant", constant, dy),
        Case("large", _LARGE[problem.dtype] * rng.standard_normal(shape), dy),
        Case("tiny", 1e-3 * rng.standard_normal(shape), dy),
        Case("one-row", normal[:1], dy[:1]),
        Case("few-rows", normal[:FEW_ROWS], dy[:FEW_ROWS]),
    ]
    if problem.residual:
        # A stream of its own, so the other inputs are those of the plain problem.
        dh = np.random.default_rng(seed + 7).standard_normal(shape)
        cases = [dataclasses.replace(case, dh=dh[:len(case.x)]) for case in cases]
    return cases
