"""The search space of the LayerNorm family: enumeration, the default and the search's seeds.

:func:`iter_space` lists the raw space and :func:`enumerate_space` its valid points
(:func:`autonorm.ops.layer_norm.rules.check` decides). :func:`default_config` (the rule of
:mod:`.heuristic`, kept here for the callers of this module) picks a sound configuration for any
hidden size without tuning; :func:`seed_configs` gives a search its starting points, the
default first (docs/tuning.md).

Pure logic: no CuPy, no GPU.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterable, Iterator

from autonorm.ops.layer_norm.config import (
    BLOCKS_PER_SM,
    CACHES,
    CLUSTERS,
    MAX_REGS,
    ROWS_PER_BLOCK,
    STAGES,
    STATS,
    THREADS,
    VECS,
    KernelConfig,
    takes_early,
)
from autonorm.ops.layer_norm.few_rows import latency_configs
from autonorm.ops.layer_norm.heuristic import default_config, row_kernel_default
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.rules import check
from autonorm.runtime.limits import H200, DeviceLimits


def iter_space() -> Iterator[KernelConfig]:
    """Yield every point of the raw space (valid or not), in a fixed order.

    Stages belong to the bulk-copy kernel, which takes two-pass statistics, an occupancy-sized
    grid and no register cap only: its other combinations are left out rather than checked.
    """
    yield from _points()


def enumerate_space(problem: Problem, device: DeviceLimits = H200) -> list[KernelConfig]:
    """Return every valid configuration for ``problem`` on ``device``, in a fixed order.

    The points of :func:`iter_space` that :func:`check` accepts, in its order. A problem and
    device seen before reuse their answer.
    """
    return list(_valid_space(problem, device))


@functools.lru_cache(maxsize=64)
def _valid_space(problem: Problem, device: DeviceLimits) -> tuple[KernelConfig, ...]:
    """:func:`enumerate_space`'s answer, kept for the problems and devices seen last."""
    return tuple(c for c in _points(problem, device) if not check(c, problem, device))


def _points(
    problem: Problem | None = None, device: DeviceLimits = H200
) -> Iterator[KernelConfig]:
    """Yield :func:`iter_space`'s points in its order; given a problem, less refused branches.

    Checking all 76,608 points took about 0.9 s of CPU a problem; most fall to a rule that one
    or two fields decide, whatever the others are, so with a problem those are skipped before a
    configuration is built. ``check`` still decides every point yielded, and
    ``test_the_space_is_every_raw_point_that_check_accepts`` keeps the two equal.
    """
    layer = problem is not None and problem.norm == "layer"
    clusters_ok = device.cc >= 90
    for t, v, r, c, s, cl, p, keep in itertools.product(
        THREADS, VECS, ROWS_PER_BLOCK, CACHES, STATS, CLUSTERS, BLOCKS_PER_SM, (False, True)
    ):
        if problem is not None and _branch_refused(
            problem, layer, clusters_ok, t, v, r, c, s, cl, keep
        ):
            continue
        if c != "bulk":
            for m in MAX_REGS:
                # A register cap applies to 16-bit rows on the vector grid at cluster 1 only
                # (rules_registers.max_regs_reasons).
                if problem is not None and m and (
                    problem.itemsize == 4 or cl > 1 or problem.hidden % v
                ):
                    continue
                yield KernelConfig(t, v, r, c, s, cl, p, 0, m, keep_x=keep)
                if takes_early(c, cl, p, m):
                    yield KernelConfig(t, v, r, c, s, cl, p, 0, m, keep_x=keep, early=True)
        elif s == "two_pass" and p == 0:
            for st in STAGES[1:]:
                yield KernelConfig(t, v, r, c, s, cl, p, st, keep_x=keep)


def _branch_refused(
    problem: Problem, layer: bool, clusters_ok: bool, threads: int, vec: int, rows: int,
    cache: str, stats: str, cluster: int, keep_x: bool,
) -> bool:
    """Whether ``check`` refuses every configuration with these fields (rules.py's rules)."""
    if vec * problem.itemsize > 16 or threads % rows or threads < rows:
        return True
    if not layer and stats != "two_pass":
        return True
    if cluster > 1 and (not clusters_ok or rows != 1):
        return True
    if cluster > 1 and cache == "bulk" and problem.hidden % (cluster * vec):
        # rows on the vector grid split evenly; skewed rows in runs, without the residual add
        if problem.hidden % vec == 0 or problem.residual:
            return True
    if cache == "none" and ((layer and stats == "two_pass") or problem.residual):
        return True
    if cache == "bulk":
        return not clusters_ok or vec * problem.itemsize != 16 or threads < 128
    return keep_x and cluster > 1


def seed_configs(
    problem: Problem, device: DeviceLimits = H200, rows: int | None = None
) -> list[KernelConfig]:
    """Return structured starting points for a search: the default, the row kernel's neighbours.

    The default for ``rows`` comes first (what dispatch runs untuned: a search measures it
    before anything else), then with a row count the latency seeds, then the row kernel's
    default and its neighbourhood, whatever the default picked. With a budget of a few dozen
    trials in a space of thousands, TPE alone often never meets the good region: a 14-trial
    bf16 grid tune on the H200 picked winners at 56-73% of copy bandwidth where a hand sample
    had found 76-85% near the row kernel's default. Seeding the study with that default's
    neighbourhood (threads per row x0.5/x1/x2; a register cache, a shared-memory cache, or a
    register cache in a persistent grid that prefetches the next row) gives the sampler that
    region first. The persistent seeds replaced Welford ones: Welford never won after its fp32
    rebase, while a persistent t512 register kernel, never seeded, beat the fp32 12288 winner by
    x1.040 (88.7% -> 92.3% of copy). In 16-bit the neighbours are capped at 64 registers where
    the cap applies: capped, the same configs ran x1.03-x1.32 faster in 13 of 15 pairs
    (docs/tuning.md, docs/registers.md).

    Args:
        problem: the hidden size, dtype and affine flags.
        device: the GPU's limits.
        rows: the row count tuned for; a few rows add :func:`latency_seed_configs`.
    """
    seeds = [default_config(problem, device, rows)]
    if rows is not None:
        # Right after the default: the bucket searches run 10 trials against 13-16 seeds, so
        # seeds at the end would never be measured.
        seeds += [c for c in latency_seed_configs(problem, rows, device) if c not in seeds]
    base = row_kernel_default(problem, device)
    if base not in seeds:
        seeds.append(base)
    tpr0 = base.threads_per_row
    caps = (64, 0) if problem.itemsize == 2 else (0,)
    for tpr in (tpr0, tpr0 // 2, tpr0 * 2):
        for cache, blocks_per_sm in (("registers", 0), ("smem", 0), ("registers", 4)):
            per_block = max(1, min(32, 256 // max(tpr, 1)))
            threads = tpr * per_block
            if tpr < 1 or threads > 1024:
                continue
            add_first_valid(seeds, (
                KernelConfig(threads, base.vec, per_block, cache, "two_pass", 1, blocks_per_sm, 0,
                             m)
                for m in caps), problem, device)
    # One warp a block, one row a warp, the row in registers: torch.compile's kernel at 768-1024
    # (one-warp persistent reductions). The neighbours above keep 256-thread blocks, so the
    # search never met it; at fp32 1024 it ran x1.017 of the t256v4r8 kernel it replaced (99.9%
    # of copy) and at fp32 768 x1.008, in 16-bit x0.99-1.00 (docs/tuning.md).
    add_first_valid(seeds, (KernelConfig(32, base.vec, 1, "registers", "two_pass", 1, 0, 0, m)
                            for m in caps), problem, device)
    return seeds + [c for c in bulk_seed_configs(problem, device) if c not in seeds]


def latency_seed_configs(
    problem: Problem, rows: int, device: DeviceLimits = H200
) -> list[KernelConfig]:
    """Starting points for a few rows: each row split over a cluster of 8 (then 4) small blocks.

    The shapes of :func:`autonorm.ops.layer_norm.few_rows.latency_configs`, for any row length
    (the default takes them for rows of 32 KB or more only). The bucket searches (22 trials in
    a space of thousands) never sampled them (docs/tuning.md).

    Args:
        problem: the hidden size, dtype and affine flags.
        rows: the row count tuned for.
        device: the GPU's limits.
    """
    return latency_configs(problem, rows, device)


def add_first_valid(seeds: list[KernelConfig], candidates: Iterable[KernelConfig],
                    problem: Problem, device: DeviceLimits) -> None:
    """Append the first valid one of ``candidates`` to ``seeds``, unless it is there already.

    The candidates are one config under each register cap, in order of preference; nothing is
    appended if none is valid.
    """
    cfg = next((c for c in candidates if not check(c, problem, device)), None)
    if cfg is not None and cfg not in seeds:
        seeds.append(cfg)


# The most bulk-copy seeds a search starts from.
MAX_BULK_SEEDS = 8


def bulk_seed_configs(problem: Problem, device: DeviceLimits = H200) -> list[KernelConfig]:
    """Starting points in the bulk-copy kernel's region: tiles of ~16-64 KB, 2-3 stages.

    A sweep of ~3,000 bulk kernels found its winners there: 256-512 threads, 2-4 stages, a
    cluster of 2 for bf16 65536 and fp32 32768, of 4 for fp32 65536, rows of 16-32 KB alone and
    smaller rows grouped into tiles (docs/bulk-kernel.md). They keep x in L2 (``keep_x``:
    x1.02-1.05 at all nine bulk winners it was set against; docs/l2-hints.md).
    """
    if device.cc < 90:
        return []
    row_bytes = problem.hidden * problem.itemsize
    vec = problem.full_vec
    seeds: list[KernelConfig] = []
    # Rows of 16-32 KB: a row a tile at 8 vectors a thread, 64-96 KB of stages (t128 s4 at 16
    # KB, t256 s3 at 32 KB). Head to head on an H200 these beat the fwd kernel's winners at
    # fp32 4096 (x1.016), fp32 8192 (x1.019) and 16-bit 8192 (x1.022-1.025), and t256 s3 is the
    # 16-bit 16384 winner (docs/bulk-kernel.md). The loop below tiles 16 KB rows two at a time,
    # so the search never met them there.
    if 16384 <= row_bytes <= 32768 and row_bytes & (row_bytes - 1) == 0:
        cfg = KernelConfig(row_bytes // 128, vec, 1, "bulk", "two_pass", 1, 0,
                           min(4, 98304 // row_bytes), keep_x=True)
        if not check(cfg, problem, device):
            seeds.append(cfg)
    for cluster in (1, 2, 4, 8):
        seg_bytes = row_bytes // cluster
        if cluster > 1 and seg_bytes < 16384:
            continue
        rows = 1
        if cluster == 1:
            rows = max(1, min(16, 2 ** int(math.log2(max(1, 32768 // seg_bytes)))))
        # 256 before 1024: two 256-thread blocks an SM overlap one block's row sums and exchange
        # with the other's passes (t256 c4 at bf16 65536 x1.013-1.018 of t512 c2, fp32 32768
        # x1.010), and the cap of MAX_BULK_SEEDS would cut them off behind 1024.
        for threads in (512, 256, 1024):
            for stages in (2, 3):
                cfg = KernelConfig(threads, vec, rows, "bulk", "two_pass", cluster, 0, stages,
                                   keep_x=True)
                if cfg not in seeds and not check(cfg, problem, device):
                    seeds.append(cfg)
    return seeds[:MAX_BULK_SEEDS]
