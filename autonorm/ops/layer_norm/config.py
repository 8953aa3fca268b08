"""One point of the LayerNorm template family: :class:`KernelConfig` and the domain of each field.

The domains (``THREADS``, ``VECS``, ...) bound the raw space that :mod:`.space` enumerates;
which combinations can run a problem is :mod:`.rules`' to say. A configuration round-trips
through a dict (Optuna, the tuning DB) and through its short label (``t256v8r1-smem-...``).

Pure logic: no CuPy, no GPU.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Literal

CacheKind = Literal["none", "registers", "smem", "bulk"]

StatsKind = Literal["welford", "two_pass", "naive"]

THREADS = (32, 64, 128, 256, 512, 1024)

VECS = (1, 2, 4, 8)

ROWS_PER_BLOCK = (1, 2, 4, 8, 16, 32)

CACHES: tuple[str, ...] = ("none", "registers", "smem", "bulk")

STATS: tuple[str, ...] = ("welford", "two_pass")

CLUSTERS = (1, 2, 4, 8)

BLOCKS_PER_SM = (0, 1, 2, 4, 8)

# Row tiles in flight per block of the bulk-copy kernel (cache="bulk"); 0 for the others.
STAGES = (0, 1, 2, 3, 4, 6, 8)

# A register cap per thread (0: none beyond the estimate's occupancy). At 64 a quarter of the SM's
# registers serves 8 warps, so 1,024 threads fit an SM: the uncapped 16-bit winners at 768-8192
# ran at 80-96 registers and 31-35% occupancy (ncu), and the same configs capped at 64 ran
# x1.03-x1.32 faster in 13 of 15 A/B pairs (bf16 768 91.4% -> 95.5% of copy, bf16 8192
# 85.4% -> 92.3%; H200, docs/registers.md). Some kernels spill under it, so it is a search
# choice: the evaluator rejects those.
MAX_REGS = (0, 64)

# The fields the bulk-copy kernel fixes: two-pass statistics over the staged tile, and a grid
# sized by occupancy (so no blocks_per_sm).
BULK_FIXED: dict[str, object] = {"stats": "two_pass", "blocks_per_sm": 0, "max_regs": 0}

# The form KernelConfig.label() writes (the stages, keep_x, early and register-cap suffixes only
# when set).
_LABEL = re.compile(
    r"t(\d+)v(\d+)r(\d+)-([a-z]+)-([a-z_]+)-c(\d+)-p(\d+)(?:-s(\d+))?(-k)?(-e)?(?:-m(\d+))?")


def takes_early(cache: str, cluster: int, blocks_per_sm: int, max_regs: int) -> bool:
    """Whether ``early`` is a choice for these fields (search and space alike).

    The register cache, one block a row tile, unclustered and uncapped; the rules decide the
    rest (:mod:`.rules`' ``_early_reasons``).
    """
    return cache == "registers" and cluster == 1 and blocks_per_sm == 0 and max_regs == 0


@dataclass(frozen=True)
class KernelConfig:
    """One point of the template family.

    Attributes:
        threads: threads per block.
        vec: elements per vector access (vec * itemsize <= 16 bytes).
        rows_per_block: rows a block normalizes at once; each row gets threads // rows_per_block
            threads (fewer than 32 gives sub-warp rows for small hidden sizes).
        cache: where the row is held between statistics and normalization: not at all (x is
            read again, from L2 at best), in registers, or in shared memory.
        stats: ``welford`` (one pass, Chan's merge across threads) or ``two_pass`` (mean, then
            the centered sum of squares over the cached row). ``naive`` (E[x^2] - E[x]^2, no
            shift) is deliberately unstable: it exists only to show that verification fails.
        cluster: blocks of a thread-block cluster that share one row (distributed shared
            memory merges their statistics).
        blocks_per_sm: 0 launches one block (cluster) per row tile; k > 0 launches a persistent
            grid of k blocks per SM that strides over the row tiles. The bulk-copy kernel is
            always persistent, sized by occupancy, and takes 0 here.
        stages: bulk-copy kernel only (``cache="bulk"``): row tiles fetched ahead into shared
            memory by the bulk-copy engine (TMA), each tile ``rows_per_block`` rows (segments,
            with a cluster). 0 for every other cache.
        max_regs: 0 lets the register estimate set the occupancy ptxas aims at; k > 0 caps a
            thread at k registers (``__launch_bounds__`` asks for that many more blocks per
            SM). The bulk-copy kernel sizes its own occupancy and takes 0.
        keep_x: x's loads (the bulk kernel's copies, the other kernels' vector loads and
            shared-memory fills) carry an L2 ``evict_last`` hint, so L2 keeps x's lines ahead
            of y's. The bulk kernel ran x1.02-1.05 at nine winners (H200), the fwd kernel
            x1.01-1.03 at the 16-bit winners of 768-4096 and x1.00 at 8192 and fp32. A GEMM
            reading y after it lost nothing; a kernel that re-reads 16-40 MB from L2 right
            after it pays 0.2-3.6 us (docs/l2-hints.md). Dispatch drops it under
            ``AUTONORM_NO_KEEP_X=1``. Outside the bulk kernel, cluster 1 only.
        early: the row kernel with a register cache loads weight and bias right after x, before
            the statistics, at more vectors a thread than it does by itself
            (``plan.EARLY_AFFINE_ITERS``, two); in fp32 it then takes the lean math too
            (``plan.lean_fp32``). At a few rows a launch is one block's chain of steps and the
            loads issued after the statistics lengthen it: at 1-64 rows of 16-32 KB the
            default with it ran x1.04-1.16 of the same kernel without (H200, docs/kernels.md).
            Register cache, one block a row tile (no persistent grid), no cluster, no register
            cap, 3-8 vectors a thread.

    """

    threads: int = 256
    vec: int = 8
    rows_per_block: int = 1
    cache: str = "registers"
    stats: str = "welford"
    cluster: int = 1
    blocks_per_sm: int = 0
    stages: int = 0
    max_regs: int = 0
    keep_x: bool = False
    early: bool = False

    def to_dict(self) -> dict[str, object]:
        """Return the configuration as a plain dict (for JSON, Optuna and the DB)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> KernelConfig:
        """Build a configuration from :meth:`to_dict` output, ignoring unknown keys.

        The fields the bulk-copy kernel fixes (two-pass statistics, an occupancy grid) take
        those values when absent, as in a tuner trial's parameters.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        if values.get("cache") == "bulk":
            values = {**BULK_FIXED, **values}
        return cls(**values)  # type: ignore[arg-type]

    @property
    def threads_per_row(self) -> int:
        """Threads that share one row inside a block."""
        return self.threads // self.rows_per_block

    @classmethod
    def from_label(cls, label: str) -> KernelConfig:
        """Parse :meth:`label` output back into a configuration.

        Raises:
            ValueError: ``label`` is not a label of this form.
        """
        match = _LABEL.fullmatch(label)
        if match is None:
            raise ValueError(f"not a kernel label: {label!r} (e.g. t256v8r1-smem-two_pass-c1-p0)")
        t, v, r, cache, stats, c, p, s, k, e, m = match.groups()
        return cls(int(t), int(v), int(r), cache, stats, int(c), int(p), int(s or 0), int(m or 0),
                   bool(k), bool(e))

    def label(self) -> str:
        """Return a short human-readable name, e.g. ``t256v8r1-registers-welford-c1-p0``.

        Bulk configs end in their stages (``-s2``) and, keeping x in L2, ``-k``; early weight
        loads add ``-e``; capped ones end in their registers (``-m64``).
        """
        label = (
            f"t{self.threads}v{self.vec}r{self.rows_per_block}-{self.cache}-{self.stats}"
            f"-c{self.cluster}-p{self.blocks_per_sm}"
        )
        if self.stages:
            label += f"-s{self.stages}"
        if self.keep_x:
            label += "-k"
        if self.early:
            label += "-e"
        return f"{label}-m{self.max_regs}" if self.max_regs else label
