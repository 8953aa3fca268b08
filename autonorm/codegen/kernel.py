"""What rendering produces: a kernel's source and how to launch it.

:class:`RenderedKernel` is a family's rendered kernel (its C name, CUDA source, configuration
and problem); :class:`LaunchPlan` is the launch it needs: block size, dynamic shared memory,
cluster and the rule that sizes its grid. Pure data: no Jinja, no CuPy.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autonorm.runtime.limits import PORTABLE_CLUSTER_BLOCKS

if TYPE_CHECKING:
    from autonorm.ops.base import Config, Problem

# Tiles per cluster from which a resident kernel (the bulk-copy kernel) takes its tiles through
# the counter (the dynamic schedule) instead of round-robin. Counted out at the first failed
# claim, the two schedules are level at 1-4 tiles a cluster (x0.996-1.010) and the dynamic one
# gains from 8 (x1.00-1.02) and 16 (x1.02-1.05). Below 8 the static schedule stays: it gains
# nothing there and needs no zeroed counter (none captured into a graph, no workspace for an
# exported launcher); docs/bulk-kernel.md.
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
    barrier: bool = False
    reduce_tiles: int = 0
    spread_rows: int = 0
    single: bool = False

    @property
    def large_cluster(self) -> bool:
        """Whether the cluster is past the portable size (the kernel must be allowed it)."""
        return self.cluster > PORTABLE_CLUSTER_BLOCKS

    def grid(self, rows: int, sm_count: int, resident_clusters: int | None = None) -> int:
        """Return the number of blocks for ``rows`` rows (a multiple of the cluster size).

        With ``blocks_per_sm == 0`` every row tile gets its own block (cluster); otherwise a
        persistent grid of about ``blocks_per_sm`` blocks per SM strides over the tiles. A
        ``resident`` plan (the bulk-copy kernel) launches as many clusters as can be resident
        at once, ``resident_clusters`` as the occupancy API reports it: a cluster that waits
        for a free GPC would run its share of the tiles after everyone else (clusters of 4
        fill only 120 of the H200's 132 SMs). A ``barrier`` plan (a kernel whose blocks wait
        for each other) launches at most ``blocks_per_sm`` blocks per SM, and never more than
        can be resident: a block that is not resident would never arrive. Such a plan gives a
        cluster ``rows_per_block`` rows at least once there are more than ``spread_rows``
        (below that, a cluster a row). After its barrier it sums ``reduce_tiles`` tiles over
        the blocks, so with more than one row it launches a block a tile where rows alone would
        leave tiles to few blocks (one row needs no barrier: its one cluster's sums are the
        totals). A ``single`` plan launches one cluster, whatever the rows: its blocks meet
        within it.
        """
        if self.single:
            return self.cluster
        tiles = max(1, -(-rows // self.rows_per_block))
        clusters = tiles
        if self.resident:
            cap = resident_clusters or sm_count * max(self.blocks_per_sm, 1) // self.cluster
            if self.barrier:
                cap = min(cap, sm_count * max(self.blocks_per_sm, 1) // self.cluster)
                if rows > 1:
                    tiles = max(tiles, min(rows, self.spread_rows),
                                -(-self.reduce_tiles // self.cluster))
            clusters = min(tiles, max(1, cap))
        elif self.blocks_per_sm:
            clusters = min(tiles, max(1, sm_count * self.blocks_per_sm // self.cluster))
        return clusters * self.cluster

    def uses_counter(self, rows: int, grid: int) -> bool:
        """Whether a launch of ``grid`` blocks over ``rows`` rows takes the dynamic schedule.

        Only the bulk-copy kernel (a ``resident`` plan) has one, and it pays only from
        ``DYNAMIC_MIN_TILES`` tiles a cluster; below that the launch passes no counter. A
        ``barrier`` plan meets at its counter whenever it has more than one cluster.
        """
        if self.barrier:
            return grid > self.cluster
        if not self.resident:
            return False
        tiles = -(-rows // self.rows_per_block)
        return tiles >= DYNAMIC_MIN_TILES * max(1, grid // self.cluster)


@dataclass(frozen=True)
class RenderedKernel:
    """CUDA source of one kernel and everything needed to launch it."""

    name: str
    source: str
    config: Config
    problem: Problem
    launch: LaunchPlan

    @property
    def source_hash(self) -> str:
        """SHA-256 of the source (the compile cache key, with arch and CUDA version)."""
        return hashlib.sha256(self.source.encode()).hexdigest()
