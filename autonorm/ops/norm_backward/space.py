"""The backward kernels' search space, its default and the search's seeds.

Pure logic: no CuPy, no GPU.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Iterator

from autonorm.errors import ConfigError
from autonorm.ops.norm_backward.config import (
    ACCS,
    BLOCKS_PER_SM,
    CACHES,
    CLUSTERS,
    GROUPS,
    LANES_MIN_THREADS,
    MAX_CLUSTER_BLOCKS,
    STAGES,
    THREADS,
    VECS,
)
from autonorm.ops.norm_backward.config import BackwardConfig as Config
from autonorm.ops.norm_backward.few_rows import few_rows_default
from autonorm.ops.norm_backward.plan import (
    MAX_ITERS,
    SPLIT_ABOVE,
    check,
    derive_plan,
    register_cap,
)
from autonorm.ops.norm_backward.problem import BackwardProblem
from autonorm.runtime.limits import PORTABLE_CLUSTER_BLOCKS

# The default's preferences: rows held in registers, then sums in registers, shared memory, L2.
_ACC_RANK = {"registers": 0, "smem": 1, "global": 2, "reread": 3}

# Threads per SM the default aims at: enough warps in flight to cover the loads' latency.
TARGET_THREADS_PER_SM = 1024

# The default keeps this headroom under the register cap of its occupancy: the estimate runs
# up to 19% under what ptxas allocates (nvcc 13.0, sm_90: 108 estimated, spilling at 128).
DEFAULT_REG_HEADROOM = 1.25

# Bytes of x and dy a bulk-copy default keeps requested per SM (its blocks x stages x rows), and
# its threads per SM: the fastest of a grid of bulk kernels held 64 KB at 9 of 10 shapes, and
# 512 threads at 7 (H200, hidden 2048-8192, docs/backward.md).
TARGET_STAGED_BYTES = 64 * 1024
TARGET_BULK_THREADS = 512

# Rows past SPLIT_ABOVE elements (plan.py) split over a cluster of blocks, each taking at most
# TARGET_SHARE elements of the row.
TARGET_SHARE = 4096
# The split form with its sums in shared memory holds at most this many elements a thread: at
# 16 (LayerNorm fp32 16384 and 32768) it was the fastest, at 32 (16-bit LayerNorm 65536 without
# a bias) the cluster's 512-thread bulk kernel, held, with its sums in registers ran x1.19 (bf16)
# and x1.33 (fp16) over it (H200, docs/backward.md); 20-24 are untimed and keep the form.
SPLIT_SMEM_MAX_ELEMS = 24

# Registers a held row over a non-portable cluster keeps under its cap: estimated at the cap
# (128 of 128, 16-bit LayerNorm 114688 and 131072, 512 threads) it spilled 8-32 bytes, and 4
# or more under (110-124) it did not (nvcc 13.0, sm_90).
SPLIT_REG_MARGIN = 4

# The headroom the default's prefetching form needs (nvcc 13.0, sm_90, every default from 1 to
# 65536 elements: 126 estimated spilled at a cap of 128, 112 fit in 124).
PREFETCH_REG_HEADROOM = 1.1


def enumerate_space(problem: BackwardProblem, device: object) -> list[Config]:
    """Return every valid configuration for ``problem`` on ``device``, in a fixed order.

    A dispatch asks for the space once a rows bucket: a problem and device seen before reuse
    its answer.
    """
    return list(_valid_space(problem, device))


@functools.lru_cache(maxsize=64)
def _valid_space(
    problem: BackwardProblem, device: object, lane_forms: tuple[bool, ...] = (False, True)
) -> tuple[Config, ...]:
    """:func:`enumerate_space`'s answer, kept for the problems and devices seen last.

    ``lane_forms=(False,)`` leaves out the kernels whose sums meet lane by lane: the default picks
    among the others (:func:`default_config`), in half the checks.
    """
    return tuple(c for c in _candidates(problem, device, lane_forms)
                 if not check(c, problem, device))


def _candidates(
    problem: BackwardProblem, device: object, lane_forms: tuple[bool, ...] = (False, True)
) -> Iterator[Config]:
    """The configurations :func:`check` is asked about, in the order of the full product.

    Only the fields that apply to the cache vary, and whole branches that a rule of
    :func:`check` refuses whatever their other fields (a vector that does not divide the row, a
    bulk kernel without 16-byte vectors, a cluster that cannot split the row, groups past the
    cluster limit or where they meet nothing) are skipped before their configurations are built:
    the space of a 16-bit problem has about 10,600 candidates.
    """
    bulk_runs = device.cc >= 90  # type: ignore[attr-defined]
    for threads, vec in itertools.product(THREADS, VECS):
        if vec * problem.itemsize > 16 or problem.hidden % vec:
            continue
        for cache, acc, blocks in itertools.product(CACHES, ACCS, BLOCKS_PER_SM):
            if threads * blocks > device.max_threads_per_sm:  # type: ignore[attr-defined]
                continue
            if problem.sums == 0 and acc != "registers":
                continue
            bulk = cache == "bulk"
            if bulk and not (bulk_runs and vec * problem.itemsize == 16):
                continue
            prefetches = (False, True) if cache == "registers" else (False,)
            stages = STAGES[1:] if bulk else (0,)
            clusters = CLUSTERS if bulk else (1,)
            holds = (False, True) if bulk else (False,)
            groups = GROUPS if bulk else (1,)
            lanes = lane_forms if threads >= LANES_MIN_THREADS else (False,)
            for prefetch, stage, cluster, hold, group, lane in itertools.product(
                prefetches, stages, clusters, holds, groups, lanes
            ):
                if problem.hidden % (vec * cluster):
                    continue
                if group > 1 and (cluster * group > MAX_CLUSTER_BLOCKS or not problem.sums
                                  or acc in ("global", "reread") or blocks != 1):
                    continue
                yield Config(threads, vec, cache, acc, blocks, prefetch, stage, cluster, hold,
                             group, lane)


def _score(config: Config, problem: BackwardProblem, device: object) -> tuple:
    """Sort key of the default (smaller is better)."""
    plan = derive_plan(config, problem)
    cap = register_cap(config, device)
    return (
        # Long loops only where nothing shorter runs (a reloaded row's loops may be long: rows
        # of odd sizes past 16K elements have nothing else).
        plan.iters > MAX_ITERS,
        plan.regs * DEFAULT_REG_HEADROOM > cap,
        config.cache != "registers",
        _ACC_RANK[config.acc],
        config.vec * problem.itemsize != 16,  # 16-byte accesses
        not plan.even,
        abs(config.threads * config.blocks_per_sm - TARGET_THREADS_PER_SM),
        plan.iters,
        config.threads,
    )


def _bulk_score(config: Config, problem: BackwardProblem, device: object) -> tuple:
    """Sort key of the default among bulk-copy kernels (smaller is better)."""
    plan = derive_plan(config, problem)
    staged = config.blocks_per_sm * config.stages * 2 * plan.seg * problem.itemsize
    return (
        # A bulk kernel holds no row in registers and its estimate runs over what ptxas
        # allocates: of 591 two-stage bulk kernels (hidden 768-16384, 64-512 threads, nvcc 13.0,
        # sm_90) none that fits its estimate spilled, so no headroom here.
        plan.regs > register_cap(config, device),
        _ACC_RANK[config.acc],
        config.stages < 2,  # a second stage lands while the block works on the first
        config.cluster,  # each block of a cluster meets the others at every row reduction
        abs(math.log2(staged / TARGET_STAGED_BYTES)),
        abs(math.log2(config.threads * config.blocks_per_sm / TARGET_BULK_THREADS)),
        config.threads < 128,
        -config.blocks_per_sm,  # two blocks overlap one's row reductions with the other's passes
        plan.iters,
        config.threads,
    )


def _held_twin(config: Config, problem: BackwardProblem, device: object) -> Config:
    """16-bit LayerNorm's bulk default with its row held in fp32 registers, where that fits.

    Its three passes then read and convert the stage once. Half the blocks with twice the
    stages (the same bytes in flight), held, comes first: each block then has twice the
    registers and refills a stage while the other rows wait in theirs. Where that is not in the
    space, the held form of ``config`` itself. Measured (H200, docs/backward.md): bf16 2048
    80.8% of copy half-blocks held, 67.5% held at the same blocks, 74.8% without; 4096 76.5%,
    72.5%, 73.8%; the held twin at 1024 x1.19, 3072 x1.22, 8192 x1.20 over the kernel without.
    fp32 rows need no conversion and gained nothing (1024: 85.0-85.6% against 85.8%; 2048:
    92.4% half-blocks held, 87.7% held, 94.1% without), nor did RMSNorm's two passes
    (x0.98-0.99): their whole rows keep reading the stage.
    """
    if problem.norm != "layer" or problem.itemsize == 4:
        return config
    forms = [dataclasses.replace(config, hold=True)]
    if config.blocks_per_sm % 2 == 0 and config.stages * 2 in STAGES:
        forms.insert(0, dataclasses.replace(
            config, hold=True, blocks_per_sm=config.blocks_per_sm // 2, stages=config.stages * 2))
    return next((held for held in forms if not check(held, problem, device)), config)


def _split_form(
    problem: BackwardProblem, device: object, scores: dict[Config, tuple]
) -> Config | None:
    """The default for rows past :data:`SPLIT_ABOVE` elements, or None where none applies.

    The row splits over the smallest portable cluster that leaves each block at most
    :data:`TARGET_SHARE` elements (else the largest portable one), in the form that was the
    fastest of its cluster, or within a point of it, at every shape timed: 256 threads, two
    blocks an SM, two stages, the row held, sums in registers where they fit, else in shared
    memory. Where that form does not fit, the cluster's best bulk kernel, held where that fits.

    Where that kernel does not hold its share of the row with a second stage, a larger
    (non-portable) cluster's kernel that does (:func:`_held_split`). Over 16 blocks, against
    the kernel of 8 (H100, rows of 2^26 elements, docs/backward.md): LayerNorm fp32 65536
    x1.18, 131072 x2.7 or more, RMSNorm bf16 98304 and 131072 x1.03 and x1.11, fp32 x1.38 and x1.41;
    where 8 blocks hold their share with two stages they kept the lead (LayerNorm bf16 49152
    and 65536) or came within 4% (bf16 98304, fp32 49152).

    Args:
        problem: the problem.
        device: its device's limits.
        scores: the :func:`_bulk_score` of every bulk kernel without a held row whose sums
            stay out of L2.
    """
    if problem.hidden <= SPLIT_ABOVE:
        return None
    bulk = [c for c, score in scores.items() if c.cluster > 1 and not score[0]]
    if not bulk:
        return None
    clusters = sorted({c.cluster for c in bulk})
    portable = [k for k in clusters if k <= PORTABLE_CLUSTER_BLOCKS] or clusters[:1]
    cluster = next((k for k in portable if problem.hidden // k <= TARGET_SHARE), portable[-1])
    form = _split_at(cluster, bulk, problem, device, scores)
    if _streams_held(form) and cluster <= PORTABLE_CLUSTER_BLOCKS:
        return form
    for larger in (k for k in clusters if k >= cluster and k > PORTABLE_CLUSTER_BLOCKS):
        held = _held_split(larger, bulk, problem, device, scores)
        if held is not None:
            return held
    return form


def _held_split(
    cluster: int, bulk: list[Config], problem: BackwardProblem, device: object,
    scores: dict[Config, tuple],
) -> Config | None:
    """A kernel of ``cluster`` blocks holding its share of the row with two stages or more.

    :func:`_split_at`'s pick where it is one with :data:`SPLIT_REG_MARGIN` registers to spare,
    else the best-scoring such held form of a kernel of ``bulk``; None where there is none.
    """
    pick = _split_at(cluster, bulk, problem, device, scores)
    if _streams_held(pick) and _leaves_headroom(pick, problem, device):
        return pick
    held = [h for h in (dataclasses.replace(c, hold=True) for c in bulk
                        if c.cluster == cluster and c.stages >= 2)
            if not check(h, problem, device) and _leaves_headroom(h, problem, device)]
    return min(held, key=lambda h: _bulk_score(h, problem, device)) if held else None


def _leaves_headroom(config: Config, problem: BackwardProblem, device: object) -> bool:
    """Whether ``config``'s register estimate stays :data:`SPLIT_REG_MARGIN` under its cap."""
    return derive_plan(config, problem).regs + SPLIT_REG_MARGIN <= register_cap(config, device)


def _streams_held(config: Config) -> bool:
    """Whether ``config`` holds its share of the row and has a stage landing while it works."""
    return config.hold and config.stages >= 2


def _split_at(
    cluster: int, bulk: list[Config], problem: BackwardProblem, device: object,
    scores: dict[Config, tuple],
) -> Config:
    """:func:`_split_form`'s pick among the kernels of ``bulk`` split over ``cluster`` blocks."""
    vec = problem.full_vec
    for acc in ("registers", "smem"):
        form = Config(256, vec, "bulk", acc, 2, stages=2, cluster=cluster, hold=True)
        if acc == "smem" and derive_plan(form, problem).iters * vec > SPLIT_SMEM_MAX_ELEMS:
            break
        if not check(form, problem, device):
            return form
    pick = min((c for c in bulk if c.cluster == cluster), key=scores.__getitem__)
    held = dataclasses.replace(pick, hold=True)
    return held if not check(held, problem, device) else pick


def _lane_form(config: Config, problem: BackwardProblem, device: object) -> Config:
    """``config`` with sums that meet lane by lane where it is a bulk kernel summing in registers.

    Against the same kernels adding every total in each thread, such defaults ran x1.01-1.14
    for LayerNorm (bf16 1024-65536, fp32 1024-65536) and x1.00-1.04 for RMSNorm, where a held
    kernel with its sums in shared memory lost 8% (16-bit 65536 without a bias) and the
    few-row forms 1-2% (H200, docs/backward.md); those keep the thread-by-thread sums.
    """
    if config.cache != "bulk" or config.acc != "registers":
        return config
    form = dataclasses.replace(config, lanes=True)
    return config if check(form, problem, device) else form


def default_config(problem: BackwardProblem, device: object, rows: int | None = None) -> Config:
    """Return the untuned default.

    Where ``rows`` is given and few, the few-row default where one applies
    (:func:`.few_rows.few_rows_default`). On Hopper and newer: rows past :data:`SPLIT_ABOVE`
    elements split over a cluster (:func:`_split_form`); else the best bulk-copy kernel that
    takes whole rows (by :func:`_bulk_score`) where one fits with its sums out of L2, for
    16-bit LayerNorm in its held form where that fits (:func:`_held_twin`); else the space's
    best by :func:`_score` (prefetching where its registers allow), unless that keeps its sums
    in L2 and a cluster's bulk kernel can keep them in registers or shared memory. A bulk pick
    summing in registers meets its row sums lane by lane (:func:`_lane_form`).

    Raises:
        autonorm.errors.ConfigError: no configuration can run the problem.
    """
    # The few-row forms are checked as they are built; only the sums formed from the rows ask
    # for the default of many rows (and so the space).
    if rows is not None:
        few = few_rows_default(problem, device, rows, lambda: default_config(problem, device))
        if few is not None:
            return few
    # Only _lane_form makes a pick sum lane by lane: the kernels that do are left out here.
    space = _valid_space(problem, device, (False,))
    if not space:
        raise ConfigError(f"no backward kernel can run {problem.describe()}")
    # Sums in L2 behind bulk stages ran at 17-40% of copy where a reloaded row with its sums in
    # shared memory ran 39-60%: only bulk kernels with their sums elsewhere are candidates (and
    # not those that form them again from the rows, which many rows would read twice). A held
    # row enters only through _split_form and _held_twin, where it was measured.
    scores = {c: _bulk_score(c, problem, device) for c in space
              if c.cache == "bulk" and c.acc in ("registers", "smem") and not c.hold}
    split = _split_form(problem, device, scores)
    if split is not None:
        return _lane_form(split, problem, device)
    bulk = [c for c, score in scores.items() if not score[0]]
    whole = [c for c in bulk if c.cluster == 1]
    if whole:
        return _lane_form(_held_twin(min(whole, key=scores.__getitem__), problem, device),
                          problem, device)
    rest = [c for c in space if not c.prefetch and c.cache != "bulk"]
    base = min(rest or space, key=lambda c: _score(c, problem, device))
    if base.acc == "global" and bulk:
        # A cluster's sums in registers or shared memory beat sums in L2 (65536, before the
        # one-way exchange: 45.8-58.8% of copy against 22.9-36.6%; H200, docs/backward.md).
        return _lane_form(min(bulk, key=scores.__getitem__), problem, device)
    # The same kernel with two rows a block in flight, where its registers allow: x1.20-1.47
    # over it at bf16 and fp32 4096 (H200, docs/backward.md).
    prefetching = dataclasses.replace(base, prefetch=True)
    fits = derive_plan(prefetching, problem).regs * PREFETCH_REG_HEADROOM <= register_cap(
        base, device)
    return prefetching if fits and not check(prefetching, problem, device) else base


def seed_configs(
    problem: BackwardProblem, device: object, rows: int | None = None
) -> list[Config]:
    """Return the search's starting points: the default, then its neighbours in occupancy."""
    default = default_config(problem, device, rows)
    seeds = [default]
    for blocks in BLOCKS_PER_SM:
        other = dataclasses.replace(default, blocks_per_sm=blocks)
        if other != default and not check(other, problem, device):
            seeds.append(other)
    return seeds
