"""The inputs every LayerNorm kernel is verified on, chosen to break wrong kernels.

The first seven cases check the arithmetic of one row: random normal rows; rows far from zero
(mean 1000, spread 0.1 in fp32) that an unshifted one-pass variance gets wrong, and the same rows
with an outlier where the shift is taken (an uncorrected two-pass mean loses bits there);
constant rows (variance zero: the output must equal the bias exactly); large and tiny
magnitudes; and a one-cluster grid that forces every block through the grid-stride loop.

The merge cases check how the statistics of a row's parts are combined. A cluster splits a row
into 2, 4 or 8 segments, one per block, and merges their (shift, mean, M2) partials; random
rows give every segment nearly the same mean and spread, so a merge that drops Chan's
between-segment term, takes one segment's mean for the row's, or lets a block normalize about
its own segment's mean has nothing to show, and in 16-bit it passed every case above. Here the
segments differ:

- ``step-c<C>``: the means of the row's C segments alternate up and down, neighbours 2 to 4
  spreads apart (the halves, quarters or eighths of the row: each split the space can choose);
- ``hot-c<C>``: one segment, another one in each row, has eight times the spread of the rest;
- ``ramp``: the mean climbs (or falls) across the row by 2 to 4 spreads, so the segments of
  every split differ.

Every row of a merge case has its own levels, so a kernel that mixes up the rows of a tile (1 to
32 rows) shows too. Each case has :data:`VERIFY_ROWS` rows, a prime, so no rows per block (1 to
32) divides it and the last tile is always partial (docs/accuracy.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autonorm.ops.layer_norm.config import CLUSTERS
from autonorm.ops.layer_norm.problem import Problem

# Rows per verification case: prime, so no rows_per_block (1..32) divides it and the last tile
# is always partial.
VERIFY_ROWS = 37

# Offset data per dtype: mean and spread representable in the dtype (fp32: mean 1000 and
# spread 0.1; bf16 has 8 bits of mantissa, so its "far from zero" is smaller).
_OFFSET = {"float32": (1000.0, 0.1), "float16": (300.0, 1.0), "bfloat16": (64.0, 4.0)}

_LARGE = {"float32": 1e4, "float16": 1e3, "bfloat16": 1e4}

# The case that puts an outlier where the shift is taken, by name (see make_cases).
OUTLIER_CASE = "offset-outlier-first"

# The cases of one row's arithmetic, in make_cases' order (the merge cases follow them).
ROW_CASES = (
    "normal", "normal-one-cluster-grid", "offset", OUTLIER_CASE, "constant", "large", "tiny",
)

# Merge cases: segment levels 1 to 2 spreads above or below the row's base, alternating (a
# between-segment variance at least the within-segment one: a merge that drops it is off by 40%
# or more), a hot segment of eight times the spread, a ramp of 2 to 4 spreads across the row.
STEP_SPREADS = 2.0
HOT_SPREAD = 8.0
RAMP_SPREADS = 4.0


@dataclass(frozen=True)
class Case:
    """One verification input (float64 values before rounding to the dtype)."""

    name: str
    x: np.ndarray
    small_grid: bool = False  # launch one cluster only: exercises the grid-stride loop
    expect_bias: bool = False  # constant rows: output must equal the bias exactly


def cluster_splits(hidden: int) -> list[int]:
    """Return the cluster sizes (over 1) that can split a row of ``hidden`` elements evenly."""
    return [c for c in CLUSTERS if c > 1 and hidden % c == 0]


def make_cases(problem: Problem, seed: int = 0, rows: int = VERIFY_ROWS) -> list[Case]:
    """Build the verification inputs for ``problem`` (deterministic for a seed).

    The row cases come first, in the order of :data:`ROW_CASES`, then the merge cases.
    """
    rng = np.random.default_rng(seed)
    n = problem.hidden
    normal = rng.standard_normal((rows, n))
    mean, spread = _OFFSET[problem.dtype]
    offset = mean + spread * rng.standard_normal((rows, n))
    # The shift is the first element of a row (or of a cluster's segment): make it an outlier,
    # 3000 spreads above an offset row's mean. Measured on the H200: the uncorrected fp32
    # two-pass 2.1e-6 to 9.9e-6 at hidden 4096-65536, over the 2e-6 tolerance; the corrected
    # two-pass 0.8e-7 to 1.2e-7 (docs/accuracy.md).
    outlier_first = offset.copy()
    outlier_first[:, [0, n // 2]] = mean + 3000 * spread
    constant = np.repeat(rng.uniform(-3, 3, (rows, 1)), n, axis=1)
    cases = [
        Case("normal", normal),
        Case("normal-one-cluster-grid", normal, small_grid=True),
        Case("offset", offset),
        Case(OUTLIER_CASE, outlier_first),
        Case("constant", constant, expect_bias=True),
        Case("large", _LARGE[problem.dtype] * rng.standard_normal((rows, n))),
        Case("tiny", 1e-3 * rng.standard_normal((rows, n))),
    ]
    return cases + merge_cases(n, np.random.default_rng([seed, 1]), rows)


def merge_cases(hidden: int, rng: np.random.Generator, rows: int = VERIFY_ROWS) -> list[Case]:
    """Return the cases whose rows' segments differ in mean and spread (see the module doc).

    Values stay within a few spreads of a small per-row base, exact enough in every dtype that
    a correct kernel's error is its output's rounding.
    """
    n = hidden
    cases = []
    for c in cluster_splits(n):
        seg = n // c
        base = rng.uniform(-2.0, 2.0, (rows, 1))
        # Alternating levels: neighbouring segments 2 to 4 spreads apart, each row by its own
        # amount and sign.
        size = STEP_SPREADS * rng.uniform(0.5, 1.0, (rows, 1)) * rng.choice([-1.0, 1.0], (rows, 1))
        levels = np.where(np.arange(c) % 2 == 0, size, -size)  # (rows, c)
        step = base + np.repeat(levels, seg, axis=1) + rng.standard_normal((rows, n))
        cases.append(Case(f"step-c{c}", step))
        # One hot segment per row, a different one from row to row.
        scale = np.ones((rows, c))
        scale[np.arange(rows), np.arange(rows) % c] = HOT_SPREAD
        base = rng.uniform(-2.0, 2.0, (rows, 1))
        hot = base + np.repeat(scale, seg, axis=1) * rng.standard_normal((rows, n))
        cases.append(Case(f"hot-c{c}", hot))
    if n > 1:
        base = rng.uniform(-2.0, 2.0, (rows, 1))
        slope = RAMP_SPREADS * rng.uniform(0.5, 1.0, (rows, 1)) * rng.choice([-1.0, 1.0], (rows, 1))
        position = np.arange(n) / (n - 1) - 0.5  # -0.5 .. 0.5 across the row
        cases.append(Case("ramp", base + slope * position + rng.standard_normal((rows, n))))
    return cases


def make_affine(problem: Problem, seed: int = 1) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Return float64 weight and bias values (rounded later), or None where absent."""
    rng = np.random.default_rng(seed)
    n = problem.hidden
    weight = 1.0 + 0.1 * rng.standard_normal(n) if problem.has_weight else None
    bias = 0.1 * rng.standard_normal(n) if problem.has_bias else None
    return weight, bias
