"""The LayerNorm family's untuned bulk-copy picks: whether the bulk kernel pays, and its shape.

:func:`autonorm.ops.layer_norm.heuristic.default_config` asks :func:`bulk_pays` whether a row
count and row size pay for the bulk kernel's fixed cost, and takes the first configuration of
:func:`bulk_configs` that ``check`` admits. The evidence of each branch is in the docstrings
and in docs/tuning.md (the default rule), docs/bulk-kernel.md and docs/kernels.md (skewed rows).
Pure arithmetic: no GPU, no database.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from autonorm.ops.layer_norm.config import CLUSTERS, KernelConfig
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.shape import skew_max, span_vectors
from autonorm.runtime.limits import DeviceLimits

KB = 1024

# Rows shorter than this run the row kernel.
BULK_MIN_ROW_BYTES = 16 * KB

# fp32 LayerNorm rows (no residual add) from this many bytes, at BULK_ROWS_PER_SM rows an SM
# and more, run the bulk kernel too, at FP32_BULK_STAGES stages up to FP32_BULK_STAGED_BYTES
# (see fp32_bulk_applies).
FP32_BULK_MIN_ROW_BYTES = 8 * KB
FP32_BULK_STAGED_BYTES = 24 * KB
FP32_BULK_STAGES = 2

# Rows an SM from which the bulk kernel runs every row of BULK_MIN_ROW_BYTES or more.
BULK_ROWS_PER_SM = 36

# From one row an SM up to BULK_ROWS_PER_SM, the bulk kernel runs rows of this many elements.
BULK_MIN_HIDDEN = 16384

# Under one row an SM, the bulk kernel runs rows of this many bytes or more.
FEW_ROWS_BULK_BYTES = 64 * KB

# A bulk tile holds a whole row up to WHOLE_ROW_BYTES with this many rows an SM or more, else
# rows are split into segments of SEGMENT_BYTES over a cluster.
WHOLE_ROW_ROWS_PER_SM = 8

WHOLE_ROW_BYTES = 64 * KB

SEGMENT_BYTES = 32 * KB

# x this many times the L2 or more: its loads carry keep_x (the row kernel's only on rows of up
# to heuristic.ROW_KEEP_X_MAX_BYTES).
KEEP_X_L2_MULTIPLE = 2

# Skewed rows (off the vector grid) of this many bytes or more take the bulk kernel from
# BULK_ROWS_PER_SM rows an SM.
SKEWED_BULK_MIN_ROW_BYTES = 4 * KB

# Shorter skewed 16-bit rows take it with several rows a tile (see skewed_tile): the short
# rows' tiles up to this many bytes, the 2-4 KB band's of SKEWED_TILE_THREADS threads past it.
SKEWED_TILE_SHORT_ROW_BYTES = 2 * KB

SKEWED_TILE_THREADS = 256

# A tile row of 2-4 KB of up to this many aligned vectors gets 64 threads (4 rows a tile), a
# longer one 128 (2 rows), so a thread holds at most 4 vectors (rules_bulk: BULK_MAX_ITERS // 2).
SKEWED_TILE_SHORT_SPAN = 256


@dataclass(frozen=True)
class SkewedTile:
    """The bulk kernel's tile for skewed 16-bit rows: its threads, its rows, stages to try.

    Attributes:
        threads: threads a block (the tile's rows share them evenly).
        rows: rows a tile.
        stages: stage counts in the order tried, the first that fits the device taken.
    """

    threads: int
    rows: int
    stages: tuple[int, ...]


@dataclass(frozen=True)
class ShortTileRule:
    """Which short skewed 16-bit rows (up to SKEWED_TILE_SHORT_ROW_BYTES) of one norm form tile.

    Attributes:
        first_span: the fewest aligned vectors a row spans to take a tile; shorter rows keep
            the row kernel.
        warp_span: the most aligned vectors a row spans to run a warp a row (WARP_TILE).
        longer: the tile of rows that span more.
        last_span: the most aligned vectors a row spans to take a tile (None: every short row);
            longer rows keep the row kernel.
    """

    first_span: int
    warp_span: int
    longer: SkewedTile
    last_span: int | None = None


# A warp a row, 8 rows a 256-thread tile; 64 threads a row, 2 rows a 128-thread tile or 4 rows
# a 256-thread one. One stage each: two ran 3-10 points behind (docs/kernels.md).
WARP_TILE = SkewedTile(SKEWED_TILE_THREADS, 8, (1,))
PAIR_TILE = SkewedTile(128, 2, (1,))
QUAD_TILE = SkewedTile(SKEWED_TILE_THREADS, 4, (1,))

# Short skewed rows' tiles by (norm, residual add). Each bound lies between two rows timed on
# an H100 at 2^26 elements (aligned vectors spanned: 300 spans 38, 390 50, 490 62, 555 71, 745
# 94, 850 107, 1001 126; docs/kernels.md): LayerNorm ran 390-850 fastest a warp a row and
# 1001-1019 64 threads a row; after the add 300 a warp a row and 490-1001 64 threads a row;
# RMSNorm 490-555 a warp a row and 745-1019 64 threads a row, at 300 level with the row kernel;
# RMSNorm after the add 490 and 850 four rows of 64 threads (untimed past 850, where the 2-4 KB
# tiles ran behind the row kernel). The row kernel kept LayerNorm's 257 and 300.
SHORT_TILE_RULES = {
    ("layer", False): ShortTileRule(first_span=50, warp_span=116, longer=PAIR_TILE),
    ("layer", True): ShortTileRule(first_span=38, warp_span=50, longer=PAIR_TILE),
    ("rms", False): ShortTileRule(first_span=50, warp_span=82, longer=PAIR_TILE),
    ("rms", True): ShortTileRule(first_span=62, warp_span=0, longer=QUAD_TILE, last_span=107),
}


def bulk_pays(problem: Problem, device: DeviceLimits, bucket: int) -> bool:
    """Whether the bulk-copy kernel's rows and row count pay its fixed cost.

    Rows of 16 KB or more; at many rows also fp32 LayerNorm's from 8 KB, skewed rows from
    4 KB and the shorter skewed 16-bit rows that :func:`skewed_tile` tiles.
    """
    row_bytes = problem.hidden * problem.itemsize
    many = _many(device, bucket)
    if problem.hidden % problem.max_vec and many:
        return row_bytes >= SKEWED_BULK_MIN_ROW_BYTES or skewed_tile(problem) is not None
    if row_bytes < BULK_MIN_ROW_BYTES:
        return many and fp32_bulk_applies(problem) and row_bytes >= FP32_BULK_MIN_ROW_BYTES
    if many:
        return True
    if bucket >= device.sm_count:
        return problem.hidden >= BULK_MIN_HIDDEN
    return row_bytes >= FEW_ROWS_BULK_BYTES


def bulk_configs(problem: Problem, device: DeviceLimits, bucket: int) -> Iterator[KernelConfig]:
    """Bulk-copy configurations of the winners' shape, the preferred cluster and stages first.

    The shape follows the bytes a tile stages (x's rows, and the residual's with the residual
    add), the threads the vectors of x's segment.

    Then the other clusters, nearest first, and fewer stages: the first that ``check`` admits
    is the pick (the hidden size may not split over the preferred cluster, a device may hold
    fewer stages).
    """
    vec = problem.full_vec
    # A tile's bytes: what a row reads, half what it moves (with the residual add, the
    # residual's row is staged beside x's, in float32 beside 16-bit x with a wide residual).
    row_bytes = problem.row_io_bytes // 2
    if not problem.on_vector_grid:
        yield from skewed_bulk_configs(problem, device, bucket, row_bytes)
        return
    whole = WHOLE_ROW_BYTES if bucket >= WHOLE_ROW_ROWS_PER_SM * device.sm_count else SEGMENT_BYTES
    preferred = _segment_cluster(row_bytes) if row_bytes > whole else 1
    keep_x = keeps_x(problem, device, bucket)
    for cluster in _nearest_first(CLUSTERS, preferred):
        segment_bytes = row_bytes / cluster
        vectors = math.ceil(problem.hidden / cluster / vec)
        threads = bulk_threads(vectors)
        if cluster > 1:
            stages = 2
        elif (fp32_bulk_applies(problem) and segment_bytes <= FP32_BULK_STAGED_BYTES
              and _many(device, bucket)):
            stages = FP32_BULK_STAGES
        else:
            stages = 4 if segment_bytes <= 24 * KB else 3 if segment_bytes <= 48 * KB else 2
        for fewer in range(stages, 0, -1):
            yield KernelConfig(threads, vec, 1, "bulk", "two_pass", cluster, 0, fewer,
                               keep_x=keep_x)


def skewed_bulk_configs(
    problem: Problem, device: DeviceLimits, bucket: int, row_bytes: int
) -> Iterator[KernelConfig]:
    """The bulk kernel for skewed rows: unclustered up to 64 KB, two stages, then one.

    Past 64 KB a block alone over them ran behind the row kernel (fp32 26531: 57.7% of copy
    against 67.9%), and a cluster splits them into runs of their aligned vectors instead
    (:func:`skewed_cluster_configs`). From 4 KB, at 2^26 elements, this pick
    ran x0.90-2.2 of the row kernel's default at 23 sizes: ahead at 20, behind at bf16 8191 and
    fp16 3001 (x0.98) and fp32 3003 (x0.90); under 4 KB, a row a block, it lost at bf16 513
    and 1537, where 16-bit rows now take tiles of several rows (:func:`skewed_tile`). Its
    threads are the aligned rule's: the fewest that keep a thread to 8 vectors of the row's
    span, one vector longer than the row. Two stages: the best count or within 10% of it at 9
    of 12 sizes (15% at all), where the aligned rule's four ran x0.79-0.98 of two
    (docs/kernels.md, skewed rows). RMSNorm after the residual add takes one stage first: at
    2051-12289 in every dtype it ran x1.00-1.10 of two, where LayerNorm after the add ran
    x0.91-1.16 and keeps two. ``row_bytes`` is what a tile stages a row, as
    :func:`bulk_configs` counts it (the residual's row too with the add).
    """
    vec = problem.max_vec
    if row_bytes > WHOLE_ROW_BYTES:
        yield from skewed_cluster_configs(problem, device, bucket, row_bytes)
        return
    keep_x = keeps_x(problem, device, bucket)
    tile = skewed_tile(problem)
    if tile is not None:
        for stages in tile.stages:
            yield KernelConfig(tile.threads, vec, tile.rows, "bulk", "two_pass", 1, 0, stages,
                               keep_x=keep_x)
        return
    threads = bulk_threads(_skewed_span(problem))
    one_first = problem.residual and problem.norm != "layer"
    for stages in ((1, 2) if one_first else (2, 1)):
        yield KernelConfig(threads, vec, 1, "bulk", "two_pass", 1, 0, stages, keep_x=keep_x)


def skewed_tile(problem: Problem) -> SkewedTile | None:
    """The bulk tile of a skewed 16-bit row up to 4 KB (2047 elements), or None.

    Short rows, up to 2 KB: by norm and residual add, as SHORT_TILE_RULES bounds them by the
    aligned vectors a row spans (a warp a row; 64 threads a row, 2 or 4 rows a tile; one
    stage). At 2^26 elements on an H100 (``benchmarks/explore.py`` with the tiles and the row
    kernel's shapes in ``--configs``, docs/kernels.md), where the row kernel's default ran
    52-87% of copy at 390-1013, the rule's tiles ran 78-93%: LayerNorm 390 at 80.5% (51.6%),
    555 at 77.6% (58.3%), 1013 at 91.5% (58.8%); LayerNorm after the add 490 at 92.4% (69.6%);
    RMSNorm 555 at 84.3% (76.4%); RMSNorm after the add 850 at 88.0% (73.9%). The rule's tile
    was the fastest of the sweep or within 5% of it at each timed row (LayerNorm's 555 the
    furthest: 77.6% against 81.5% for 4 rows a 128-thread tile). Two stages ran 3-10 points
    behind one but in LayerNorm at 745 (1-1.5 points ahead). Shorter rows keep the row kernel:
    at 257 and 300 it ran 63-73% in LayerNorm against the tiles' 57-69%.

    Rows of 2-4 KB (1025-2047 elements): up to SKEWED_TILE_SHORT_SPAN aligned vectors, 4 a
    tile of 64 threads each, in LayerNorm (and after the residual add); longer ones
    (2041-2047 elements), 2 a tile of 128 threads, in every norm; two stages first. The row
    kernel's default, a warp a row with the row in shared memory, ran them at 77-88% of copy.
    On the H100, twice in one process, the tiles ran 2047 at 84-86% against 80-82% in bf16
    and fp16 LayerNorm, 91-92% against 85% after the add and 88.5% against 84% in RMSNorm;
    1031 at 85-87% against 79-80% in LayerNorm and 91% against 87% after the add, and
    1333-1801 level with it or ahead (after the add, 1801: 88.5% against 81.5%). RMSNorm's
    rows of up to 256 vectors keep the row kernel: the tiles ran 85-89% against its 88-92%.
    fp16 1025 ran 82-84% against 79%; bf16 1025 70-82% against 68-79%, both spread over runs.

    None for rows on the vector grid, fp32, short rows SHORT_TILE_RULES leaves to the row kernel
    and a float32 residual beside 16-bit x (untimed).
    """
    row_bytes = problem.hidden * problem.itemsize
    if problem.on_vector_grid or problem.itemsize != 2 or problem.wide_residual:
        return None
    span = _skewed_span(problem)
    if row_bytes <= SKEWED_TILE_SHORT_ROW_BYTES:
        rule = SHORT_TILE_RULES[problem.norm, problem.residual]
        if span < rule.first_span or (rule.last_span is not None and span > rule.last_span):
            return None
        return WARP_TILE if span <= rule.warp_span else rule.longer
    if row_bytes >= SKEWED_BULK_MIN_ROW_BYTES:
        return None
    if span > SKEWED_TILE_SHORT_SPAN:
        return SkewedTile(SKEWED_TILE_THREADS, 2, (2, 1))
    return SkewedTile(SKEWED_TILE_THREADS, 4, (2, 1)) if problem.norm == "layer" else None


def skewed_cluster_configs(
    problem: Problem, device: DeviceLimits, bucket: int, row_bytes: int
) -> Iterator[KernelConfig]:
    """Skewed rows past 64 KB over a cluster of the bulk kernel, as rows on the grid split.

    Block r copies and normalizes the row's aligned vectors r * run .. (r + 1) * run - 1, the
    last block the rest. The cluster is the aligned rule's (runs of up to SEGMENT_BYTES), the
    threads the fewest that keep a thread to 8 vectors of a run, two stages. At 2^26 elements
    (H100, one run of ``benchmarks/explore.py``): fp32 26531 89.6% of copy against the
    shared-memory row kernel's 82.3%, fp32 40001 92.4% against 79.3%, bf16 40001 83.6% against
    76.5%; one stage ran 57-76% there, twice the threads 50-81% (docs/kernels.md, skewed
    rows). Not with the residual add (rules_bulk), nor at fewer rows than SMs or past 8 runs
    of SEGMENT_BYTES (untimed there): those keep the row kernel.
    """
    if problem.residual or bucket < device.sm_count or row_bytes > CLUSTERS[-1] * SEGMENT_BYTES:
        return
    vec = problem.max_vec
    span = _skewed_span(problem)
    keep_x = keeps_x(problem, device, bucket)
    for cluster in _nearest_first(CLUSTERS[1:], _segment_cluster(row_bytes)):
        threads = bulk_threads(math.ceil(span / cluster))
        for stages in (2, 1):
            yield KernelConfig(threads, vec, 1, "bulk", "two_pass", cluster, 0, stages,
                               keep_x=keep_x)


def fp32_bulk_applies(problem: Problem) -> bool:
    """Whether fp32 rows of 8-24 KB take the bulk kernel at two stages (many rows).

    The row kernel and four stages left them behind their tuned winners: without the shipped
    database, on the H200, fp32 3556 ran 70.1% of copy in the row kernel and 4360 76.7% at four
    stages, where the neighbours' winner ran 96.3% at 3556 and tuning found 96.1% at two stages
    for 4360 (docs/results.md). On an H100 (two runs of ``benchmarks/explore.py``, 2^26
    elements) the bulk kernel at the rule's threads and two stages ran 97.4-99.1% of copy at
    2416, 97.7-97.9% at 3556 and 99.6% at 4360, where the row kernel's default ran 97.1-98.6%
    and 88.9% at the first two and four stages 89.7-92.5% at 4360 (docs/tuning.md). LayerNorm
    without the residual add only: the others were not timed so.
    """
    return problem.itemsize == 4 and problem.norm == "layer" and not problem.residual


def _skewed_span(problem: Problem) -> int:
    """Aligned vectors of ``max_vec`` a row spans at its furthest skew (up to one past its own)."""
    vec = problem.max_vec
    return span_vectors(problem.hidden, skew_max(problem.hidden, vec), vec)


def _many(device: DeviceLimits, bucket: int) -> bool:
    """Whether ``bucket`` rows are BULK_ROWS_PER_SM rows an SM or more."""
    return bucket >= BULK_ROWS_PER_SM * device.sm_count


def _segment_cluster(row_bytes: int) -> int:
    """The fewest blocks (2 to 8) whose segments of a row stay within SEGMENT_BYTES."""
    return next((c for c in CLUSTERS[1:] if row_bytes <= c * SEGMENT_BYTES), CLUSTERS[-1])


def _nearest_first(clusters: tuple[int, ...], preferred: int) -> list[int]:
    """``clusters`` by their distance from ``preferred`` in octaves, the smaller first."""
    return sorted(clusters, key=lambda c: (abs(math.log2(c / preferred)), c))


def bulk_threads(vectors: int) -> int:
    """The fewest threads (128 to 1024) that keep a thread to 8 of a tile row's ``vectors``.

    8 vectors a thread is the bulk kernel's limit, and this count is every bulk winner's.
    """
    return min(1024, max(128, 1 << max(0, math.ceil(vectors / 8) - 1).bit_length()))


def keeps_x(problem: Problem, device: DeviceLimits, bucket: int) -> bool:
    """Whether x, ``bucket`` rows of it, is KEEP_X_L2_MULTIPLE times the L2 or more."""
    return bucket * problem.hidden * problem.itemsize >= KEEP_X_L2_MULTIPLE * device.l2_bytes
