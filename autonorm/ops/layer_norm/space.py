"""The search space of the LayerNorm family: enumeration, the default and the search's seeds.

:func:`iter_space` lists the raw space and :func:`enumerate_space` its valid points
(:func:`autonorm.ops.layer_norm.rules.check` decides). :func:`default_config` picks a sound
configuration for any hidden size without tuning; :func:`seed_configs` gives a search its
starting points, the default first (docs/tuning.md).

Pure logic: no CuPy, no GPU.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable, Iterator

from autonorm.errors import ConfigError
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
)
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.rules import check, welford_run_cap
from autonorm.runtime.limits import H200, DeviceLimits


def iter_space() -> Iterator[KernelConfig]:
    """Yield every point of the raw space (valid or not), in a fixed order.

    Stages belong to the bulk-copy kernel, which takes two-pass statistics, an occupancy-sized
    grid and no register cap only: its other combinations are left out rather than checked.
    """
    for t, v, r, c, s, cl, p, keep in itertools.product(
        THREADS, VECS, ROWS_PER_BLOCK, CACHES, STATS, CLUSTERS, BLOCKS_PER_SM, (False, True)
    ):
        if c != "bulk":
            for m in MAX_REGS:
                yield KernelConfig(t, v, r, c, s, cl, p, 0, m, keep_x=keep)
        elif s == "two_pass" and p == 0:
            for st in STAGES[1:]:
                yield KernelConfig(t, v, r, c, s, cl, p, st, keep_x=keep)


def enumerate_space(problem: Problem, device: DeviceLimits = H200) -> list[KernelConfig]:
    """Return every valid configuration for ``problem`` on ``device``, in a fixed order."""
    return [c for c in iter_space() if not check(c, problem, device)]


def default_config(problem: Problem, device: DeviceLimits = H200) -> KernelConfig:
    """Return a sound configuration for any hidden size, without tuning.

    Aims at about four 16-byte vectors per thread, the measured sweet spot of the untuned
    kernel, and a register cache where it fits; in 16-bit under the 64-register cap (see
    ``_capped_default``; docs/tuning.md).
    """
    vec = problem.max_vec
    vectors = math.ceil(problem.hidden / vec)
    tpr = min(1024, max(1, 1 << math.ceil(math.log2(max(1, math.ceil(vectors / 4))))))
    rows = min(32, max(1, 128 // tpr))
    threads = tpr * rows
    for cache, stats in (("registers", "two_pass"), ("smem", "two_pass")):
        cfg = KernelConfig(threads, vec, rows, cache, stats, 1, 0)
        if not check(cfg, problem, device):
            return _capped_default(cfg, problem, device)
    # Rows past one block's shared memory: split across a cluster (Hopper) and keep the two-pass
    # statistics (Welford without a cache re-reads x from global memory to normalize).
    for cluster in CLUSTERS[1:]:
        cfg = KernelConfig(1024, vec, 1, "smem", "two_pass", cluster, 0)
        if not check(cfg, problem, device):
            return cfg
    cfg = KernelConfig(threads, vec, rows, "none", "welford", 1, 0)
    if not check(cfg, problem, device):
        return cfg
    # Very long rows: welford without a cache fits in one block up to its run cap (fp32: 2048
    # elements per thread, WELFORD_RUN_MAX); past it split the row across a cluster, of 512-thread
    # blocks where 1024 would spill, with narrower vectors where the widest do not divide.
    for vec_try in (v for v in VECS[::-1] if v <= vec):
        for cluster in CLUSTERS:
            for threads in (1024, 512):
                cfg = KernelConfig(threads, vec_try, 1, "none", "welford", cluster, 0)
                if not check(cfg, problem, device):
                    return cfg
    cap = welford_run_cap(problem)
    raise ConfigError(
        f"unsupported hidden size {problem.hidden} ({problem.dtype}): no configuration can run it "
        f"on {device.name}: a {problem.dtype} Welford run is at most {cap:,} elements per "
        f"thread, so rows over {1024 * cap:,} elements need a thread-block cluster, which needs "
        f"the hidden size to be a multiple of the cluster size times the vector width"
    )


def _capped_default(config: KernelConfig, problem: Problem, device: DeviceLimits) -> KernelConfig:
    """Return the 16-bit default under the 64-register cap (fp32 stays as it is).

    Its register cache where the cap holds it, else the same shape with a shared-memory cache.
    On the H200 (2^26 elements) the capped default ran x1.04-x1.61 faster than the uncapped one
    at 10 of 12 bf16 hidden sizes from 768 to 16384 (x1.31 at 8192, x1.61 at 11008) and alike
    in fp16; at 1536 and 2048 (two rows of 64 threads a block) it ran x0.975 and x0.931
    (docs/registers.md).
    """
    if problem.itemsize != 2:
        return config
    for candidate in (
        dataclasses.replace(config, max_regs=64),
        dataclasses.replace(config, cache="smem", max_regs=64),
    ):
        if not check(candidate, problem, device):
            return candidate
    return config


def seed_configs(
    problem: Problem, device: DeviceLimits = H200, rows: int | None = None
) -> list[KernelConfig]:
    """Return structured starting points for a search: the default and its neighbours.

    With a budget of a few dozen trials in a space of thousands, TPE alone often never meets
    the good region: a 14-trial bf16 grid tune on the H200 picked winners at 56-73% of copy
    bandwidth where a hand sample had found 76-85% near the default. Seeding the study with the
    default's neighbourhood (threads per row x0.5/x1/x2; a register cache, a shared-memory
    cache, or a register cache in a persistent grid that prefetches the next row) gives the
    sampler that region first. The persistent seeds replaced Welford ones: Welford never won
    after its fp32 rebase, while a persistent t512 register kernel, never seeded, beat the fp32
    12288 winner by x1.040 (88.7% -> 92.3% of copy). In 16-bit the neighbours are capped at 64
    registers where the cap applies: capped, the same configs ran x1.03-x1.32 faster in 13 of
    15 pairs (docs/tuning.md, docs/registers.md).

    Args:
        problem: the hidden size, dtype and affine flags.
        device: the GPU's limits.
        rows: the row count tuned for; a few rows add :func:`latency_seed_configs`.
    """
    base = default_config(problem, device)
    tpr0 = base.threads_per_row
    seeds = [base]
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
    seeds += [c for c in bulk_seed_configs(problem, device) if c not in seeds]
    if rows is None:
        return seeds
    # Right after the default: the bucket searches run 10 trials against 13-16 seeds, so seeds
    # at the end would never be measured.
    latency = latency_seed_configs(problem, rows, device)
    return seeds[:1] + latency + [c for c in seeds[1:] if c not in latency]


def latency_seed_configs(
    problem: Problem, rows: int, device: DeviceLimits = H200
) -> list[KernelConfig]:
    """Starting points for a few rows: each row split over a cluster of 8 (then 4) small blocks.

    With fewer rows than SMs most SMs idle, and a row's time is one block's chain of load,
    reduce and store; split over 8 blocks of 128 threads (one stage: the row's slice loaded once
    by the bulk engine) each chain is an eighth as long. Head to head at hidden 16384 (H200):
    rows 1 x1.017 (bf16), x1.063 (fp16), x1.170 (fp32) of the winners tuned without them; rows 8
    x1.013 (fp16), x1.086 (fp32), bf16 x0.985; rows 64 x0.84-0.93, so the seeds stop where the
    blocks would outnumber the SMs. The bucket searches (22 trials in a space of thousands)
    never sampled them (docs/tuning.md).

    Args:
        problem: the hidden size, dtype and affine flags.
        rows: the row count tuned for.
        device: the GPU's limits.
    """
    if device.cc < 90:
        return []
    vec = 16 // problem.itemsize
    seeds = []
    for cluster in (8, 4):
        cfg = KernelConfig(128, vec, 1, "bulk", "two_pass", cluster, 0, 1)
        if rows * cluster <= device.sm_count and not check(cfg, problem, device):
            seeds.append(cfg)
    return seeds


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
    vec = 16 // problem.itemsize
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
