"""One point of the backward kernels' space: :class:`BackwardConfig` and each field's domain.

Pure logic: no CuPy, no GPU.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from autonorm.runtime.limits import PORTABLE_CLUSTER_BLOCKS

THREADS = (32, 64, 128, 256, 512, 1024)

VECS = (1, 2, 4, 8)

# Where a row's x and dy are held between the passes: registers, not at all (read again, from
# L2 at best, which rows too long for registers need), or shared memory, where the bulk-copy
# engine lands them `stages` rows ahead of the block (Hopper and newer).
CACHES: tuple[str, ...] = ("registers", "none", "bulk")

# Where a block keeps its running column sums of dy * xhat (and dy): registers, shared memory,
# or its own row of the fp32 partials in global memory (L2), for rows too long for the others;
# or nowhere ("reread"): each row writes its statistics, and after the grid barrier the column
# sums form dy * xhat again from the rows, read back from L2 where they still are. That spares
# the partial rows, which at few rows cost more bytes than the rows themselves.
ACCS: tuple[str, ...] = ("registers", "smem", "global", "reread")

# Blocks per SM of the resident grid: its size, and so the number of partial rows.
BLOCKS_PER_SM = (1, 2, 3, 4, 6, 8)

# Rows a bulk-copy block has requested ahead (its shared-memory stages); 0 for the other caches.
STAGES = (0, 1, 2, 3, 4)

# Blocks of a thread-block cluster that split each row's columns (bulk-copy kernels): each holds
# the sums of its share of the columns, and the row's statistics meet in distributed shared
# memory. A cluster past 8 blocks is non-portable: the kernel asks the driver for it, and only
# devices that allow it run one (DeviceLimits.max_cluster_blocks).
CLUSTERS = (1, 2, 4, 8, 16)

# Groups of a cluster's blocks that take rows side by side (bulk-copy kernels launched as one
# cluster): each group of ``cluster`` blocks takes every ``groups``-th row, and the groups'
# column sums meet in distributed shared memory, not at a grid barrier. A cluster of
# ``cluster * groups`` blocks stays within the 8 a portable cluster may have.
GROUPS = (1, 2, 4, 8)
MAX_CLUSTER_BLOCKS = PORTABLE_CLUSTER_BLOCKS

# The fewest threads a block adding a row's sums by lanes needs: two warps, whose totals meet.
LANES_MIN_THREADS = 64

_LABEL = re.compile(
    r"t(\d+)v(\d+)-([a-z]+)-acc([a-z]+)-p(\d+)(-f)?(?:-s(\d+))?(?:-c(\d+))?(?:-g(\d+))?"
    r"(-h)?(-l)?")


@dataclass(frozen=True)
class BackwardConfig:
    """One backward kernel.

    Attributes:
        threads: threads per block; a block works on one row at a time.
        vec: elements per vector access (vec * itemsize <= 16 bytes, dividing the hidden size).
        cache: ``registers`` holds the row's x and dy in registers across the passes; ``none``
            reads them again in each pass.
        acc: where the block's column sums live while it runs (see :data:`ACCS`).
        blocks_per_sm: blocks per SM of the resident grid (at most what fits at once).
        prefetch: with the row in registers, load the block's next row while working on this
            one (two rows a block in flight, twice the registers for them).
        stages: with ``cache="bulk"``, the rows of x and dy a block holds in shared memory, each
            requested from the bulk-copy engine as soon as its stage is free; 0 otherwise.
        cluster: with ``cache="bulk"``, the blocks of a cluster that split each row's columns
            (1: a block takes whole rows).
        hold: with ``cache="bulk"``, each thread reads its share of a row from the stage once,
            into fp32 registers (x, dy and dy * w) that every pass reads, and the stage takes
            its next row as soon as the first reduction has met; without it each pass reads
            and converts the stage again, and the stage is refilled after the row.
        lanes: a row's sums meet lane by lane: each warp's totals by shuffles that halve the
            values a lane carries at every level, the warps' totals by one shared load a lane
            and a butterfly (and, for a held row, the cluster's totals likewise); without it
            every thread adds every warp's (and block's) totals in turn. Fewer instructions
            against a longer chain of shuffles: which wins depends on the kernel.
    """

    threads: int = 256
    vec: int = 8
    cache: str = "registers"
    acc: str = "registers"
    blocks_per_sm: int = 2
    prefetch: bool = False
    stages: int = 0
    cluster: int = 1
    hold: bool = False
    groups: int = 1
    lanes: bool = False

    def to_dict(self) -> dict[str, object]:
        """Return the fields as plain JSON values."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> BackwardConfig:
        """Build a configuration from a dict (unknown keys ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})  # type: ignore[arg-type]

    def label(self) -> str:
        """Return a short readable name, e.g. ``t256v8-registers-accsmem-p2``.

        ``-f`` marks prefetch, ``-s3`` three bulk-copy stages, ``-c4`` a cluster of four and
        ``-g2`` two groups of blocks taking rows side by side, ``-h`` a row held in fp32
        registers, ``-l`` sums that meet lane by lane.
        """
        return (f"t{self.threads}v{self.vec}-{self.cache}-acc{self.acc}"
                f"-p{self.blocks_per_sm}{'-f' if self.prefetch else ''}"
                f"{f'-s{self.stages}' if self.stages else ''}"
                f"{f'-c{self.cluster}' if self.cluster > 1 else ''}"
                f"{f'-g{self.groups}' if self.groups > 1 else ''}"
                f"{'-h' if self.hold else ''}"
                f"{'-l' if self.lanes else ''}")

    @classmethod
    def from_label(cls, label: str) -> BackwardConfig:
        """Parse :meth:`label` output.

        Raises:
            ValueError: ``label`` is not a backward configuration's label.
        """
        match = _LABEL.fullmatch(label)
        if match is None:
            raise ValueError(f"not a backward kernel label: {label!r}")
        threads, vec, cache, acc, blocks, prefetch, stages, cluster, groups, hold, lanes = (
            match.groups())
        return cls(int(threads), int(vec), cache, acc, int(blocks), prefetch is not None,
                   int(stages or 0), int(cluster or 1), hold is not None, int(groups or 1),
                   lanes is not None)
