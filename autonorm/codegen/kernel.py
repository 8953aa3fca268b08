"""Render a (KernelConfig, Problem) into CUDA C++ source and its launch plan.

Rendering is pure and deterministic: the same inputs give the same bytes, on any machine, with
no GPU. Compiling is :mod:`autonorm.compiler`'s job.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.problem import Problem

# Tiles per cluster from which the bulk kernel takes its tiles through the counter (the dynamic
# schedule) instead of round-robin. With the count-out at exit the counter cost a launch ~1 us
# (H200, benchmarks/NOTES.md 92: x0.87-0.96 of static at 1-4 tiles a cluster); counted out at the
# first failed claim (93, 94) the two are level there (x0.996-1.010) and the dynamic one gains from
# 8 (x1.00-1.02) and 16 (x1.02-1.05). Below 8 the static schedule stays: it gains nothing there and
# needs no zeroed counter (none captured into a graph, no workspace for an exported launcher).
DYNAMIC_MIN_TILES = 8


@dataclass(frozen=True)
class LaunchPlan:
    """How to launch a rendered kernel: block, dynamic shared memory and the grid rule."""

    threads: int
    smem_bytes: int
    cluster: int
    rows_per_block: int
    blocks_per_sm: int
    resident: bool = False

    def grid(self, rows: int, sm_count: int, resident_clusters: int | None = None) -> int:
        """Return the number of blocks for ``rows`` rows (a multiple of the cluster size).

        With ``blocks_per_sm == 0`` every row tile gets its own block (cluster); otherwise a
        persistent grid of about ``blocks_per_sm`` blocks per SM strides over the tiles. A
        ``resident`` plan (the bulk-copy kernel) launches as many clusters as can be resident
        at once, ``resident_clusters`` as the occupancy API reports it: a cluster that waits
        for a free GPC would run its share of the tiles after everyone else (clusters of 4
        fill only 120 of the H200's 132 SMs).
        """
        tiles = max(1, -(-rows // self.rows_per_block))
        clusters = tiles
        if self.resident:
            cap = resident_clusters or sm_count * max(self.blocks_per_sm, 1) // self.cluster
            clusters = min(tiles, max(1, cap))
        elif self.blocks_per_sm:
            clusters = min(tiles, max(1, sm_count * self.blocks_per_sm // self.cluster))
        return clusters * self.cluster

    def uses_counter(self, rows: int, grid: int) -> bool:
        """Whether a launch of ``grid`` blocks over ``rows`` rows takes the dynamic schedule.

        Only the bulk-copy kernel (a ``resident`` plan) has one, and it pays only from
        ``DYNAMIC_MIN_TILES`` tiles a cluster; below that the launch passes no counter.
        """
        if not self.resident:
            return False
        tiles = -(-rows // self.rows_per_block)
        return tiles >= DYNAMIC_MIN_TILES * max(1, grid // self.cluster)


@dataclass(frozen=True)
class RenderedKernel:
    """CUDA source of one kernel and everything needed to launch it."""

    name: str
    source: str
    config: KernelConfig
    problem: Problem
    launch: LaunchPlan

    @property
    def source_hash(self) -> str:
        """SHA-256 of the source (the compile cache key, with arch and CUDA version)."""
        return hashlib.sha256(self.source.encode()).hexdigest()
