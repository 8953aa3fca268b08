"""The per-thread work and the shared memory of a configuration on a problem.

:class:`Shape` is what a template unrolls: the segment of a row a block handles, the threads
that share it and the vectors each thread reads. The shared-memory sizes follow from it and
from the kernel's scratch layout. Pure arithmetic without validity checks: :mod:`.plan`
gathers these facts with the others, and :mod:`.rules` judges them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.problem import Problem

# Shared memory the row kernel needs besides the row cache: reduction scratch, 2 buffers x 32
# warps x 4 floats (Welford's count, shift, mean and M2), plus the cluster exchange slots.
SCRATCH_SMEM = 2 * 32 * 4 * 4 + 2 * 4 * 4


@dataclass(frozen=True)
class Shape:
    """Derived per-thread work of a configuration on a problem (what the template unrolls)."""

    segment: int  # elements of a row that one block handles (hidden / cluster), or its stride
    threads_per_row: int
    iters: int  # vector accesses per thread per row
    cache_regs: int  # 32-bit registers a thread spends on a register row cache
    smem_cache_bytes: int  # bytes of shared memory for a shared-memory row cache
    vec: int  # elements per vector access
    head: int = 0  # the furthest a row starts into an aligned vector (0: rows on the grid)
    # The row kernel's cluster deals a row's aligned vectors out in runs of `segment / vec`:
    # ragged when the last block's run is shorter, or when rows are skewed.
    ragged: bool = False

    @property
    def skewed(self) -> bool:
        """True when rows start off the vector grid (vec does not divide the hidden size)."""
        return self.head > 0

    @property
    def period(self) -> int:
        """Rows from one to the next that starts at the same offset: vec / gcd(hidden, vec)."""
        return self.vec // (self.vec - self.head)

    @property
    def even(self) -> bool:
        """True when the vectors tile the segment exactly (no tail guard needed)."""
        return (not self.skewed and not self.ragged
                and self.segment == self.iters * self.threads_per_row * self.vec)

    @property
    def vectors(self) -> int:
        """Vectors of a segment: the most a row spans.

        The last one is partial when ``vec`` does not divide the segment. A skewed row starts
        up to ``head`` elements into its first aligned vector, so it may span one more. A
        ragged segment is a run of whole aligned vectors already.
        """
        if self.ragged:
            return self.segment // self.vec
        return span_vectors(self.segment, self.head, self.vec)


def derive_shape(config: KernelConfig, problem: Problem) -> Shape:
    """Compute the per-thread work of ``config`` on ``problem`` (no validity checks)."""
    cluster = max(config.cluster, 1)
    segment = problem.hidden // cluster
    tpr = max(config.threads // max(config.rows_per_block, 1), 1)
    # Rows whose length is not a multiple of the vector start at varying offsets into the
    # aligned vector grid: each row covers its span of aligned vectors, partial at both ends.
    head = skew_max(problem.hidden, config.vec)
    vectors = span_vectors(segment, head, config.vec)
    ragged = False
    splits_ragged = head > 0 if config.cache == "bulk" else (
        head or problem.hidden % (cluster * config.vec))
    if cluster > 1 and splits_ragged:
        # The row kernel splits any row: block r of a cluster takes the row's aligned vectors
        # r * run .. (r + 1) * run - 1, the last block fewer. The bulk kernel splits skewed
        # rows so, one copy a block; rows on the grid it splits into equal segments (the
        # hidden size must divide: rules).
        vectors = math.ceil(span_vectors(problem.hidden, head, config.vec) / cluster)
        segment = vectors * config.vec
        ragged = True
    iters = math.ceil(vectors / tpr)
    # A row cache holds h with the residual add: float32 beside 16-bit x with a wide residual.
    # The bulk kernel's stages hold x (the residual's are sized by the plan).
    itemsize = problem.itemsize if config.cache == "bulk" else problem.h_itemsize
    vec_bytes = config.vec * itemsize
    cache_regs = iters * math.ceil(vec_bytes / 4)
    row_elements = vectors * config.vec if head else segment
    smem = config.rows_per_block * row_elements * itemsize
    return Shape(segment, tpr, iters, cache_regs, smem, config.vec, head, ragged)


def span_vectors(segment: int, head: int, vec: int) -> int:
    """Aligned vectors a segment spans when it starts up to ``head`` elements into one."""
    return math.ceil((segment + head) / vec)


def skew_max(hidden: int, vec: int) -> int:
    """The furthest a row of ``hidden`` elements starts into an aligned vector of ``vec``.

    Row r starts (r * hidden) % vec elements in: every multiple of gcd(hidden, vec) below vec
    comes round. 0 exactly when ``vec`` divides ``hidden``: rows on the vector grid.
    """
    return vec - math.gcd(hidden, vec)


def bulk_scratch_bytes(stages: int, rows_per_block: int, cluster: int = 1) -> int:
    """Shared memory of the bulk-copy kernel besides its stages.

    That is the stages' mbarriers (a cluster: two more for the exchange), the reduction scratch
    ([2][32][2] floats), the cluster exchange slots ([2][rows][cluster][4] floats), the ring of
    claimed tiles (Q = max(2 x stages, 4) mbarriers and ints) and each stage's tile (ints).
    """
    exchange = 2 * 8 if cluster > 1 else 0
    ring = max(2 * stages, 4)
    return (stages * 8 + exchange + 2 * 32 * 2 * 4 + 2 * rows_per_block * max(cluster, 1) * 4 * 4
            + ring * (8 + 4) + stages * 4)


def stage_bytes(config: KernelConfig, shape: Shape) -> int:
    """Shared memory of the bulk-copy kernel's stages: stages x rows per tile x segment bytes."""
    return max(config.stages, 1) * shape.smem_cache_bytes


def launch_smem_bytes(config: KernelConfig, shape: Shape) -> int:
    """Dynamic shared memory a launch of ``config`` needs, in bytes, given its shape."""
    if config.cache == "bulk":
        return stage_bytes(config, shape) + bulk_scratch_bytes(
            max(config.stages, 1), config.rows_per_block, config.cluster)
    cache = shape.smem_cache_bytes if config.cache == "smem" else 0
    return cache + SCRATCH_SMEM
