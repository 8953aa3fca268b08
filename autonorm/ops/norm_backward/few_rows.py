"""The backward defaults at few rows: a row in registers, small blocks, groups, rows reread.

At few rows a backward is a launch, a few row reductions and the column sums meeting: its time
is latency, and the kernel that wins is not the one that streams many rows fastest.
:func:`few_rows_default` picks among the forms measured at those rows (docs/backward.md).

Pure logic: no CuPy, no GPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from autonorm.ops.base import rows_bucket
from autonorm.ops.norm_backward.config import CLUSTERS, GROUPS, MAX_CLUSTER_BLOCKS, THREADS
from autonorm.ops.norm_backward.config import BackwardConfig as Config
from autonorm.ops.norm_backward.plan import SPLIT_ABOVE, check
from autonorm.ops.norm_backward.problem import BackwardProblem

# At up to FEW_ROWS rows a backward is a launch, a few row reductions and the column sums
# meeting: its time is latency, and a block of FEW_THREADS threads with one to four vectors of
# a row each, the row split over a cluster of up to FEW_CLUSTER blocks, finished first. At
# hidden 4096 (H200, rows 1-64, both norms, bf16 and fp32, docs/backward.md) it took 2.3-9.0 us
# where the bulk default took 3.1-12.3 (x1.19-1.69); at 256 rows it did not win (x0.91-1.00).
FEW_ROWS = 64
FEW_THREADS = 128
FEW_CLUSTER = 4

# At 2 to GROUP_ROWS rows (a rows bucket) one cluster of groups takes every row: each group of
# blocks at most GROUP_ROWS_PER_BLOCK rows of at most GROUP_BLOCK_BYTES of x in all, the groups'
# sums meeting in distributed shared memory instead of at a grid barrier. Against the few-row
# form (or the default where there is none) in the same run (H200, CUDA-graph replay,
# docs/backward.md): bf16 LayerNorm 4096 at 2 rows 3.4 us against 5.8, at 8 rows 4.9 against
# 6.0; 1024 at 8 rows, a block a row, 3.0 against 5.1; fp32 LayerNorm 4096 at 2 rows 3.3
# against 4.9, RMSNorm 4096 at 8 rows 3.5 against 4.4. Four rows a block lost (LayerNorm bf16
# 4096 at 32 rows: 11.3 against 7.0), and so did two of 16 KB each (RMSNorm fp32 8192 at 8 rows:
# 5.6 against 4.7).
GROUP_ROWS = 8
GROUP_ROWS_PER_BLOCK = 2
GROUP_BLOCK_BYTES = 16 * 1024


# At one row a backward is one block's chain of dependent steps: a launch, the row's loads, its
# reductions and its stores. A row held in registers, loaded straight from global memory in
# vectors of ONE_ROW_VEC elements, spares the bulk copy's trip through shared memory. By
# CUDA-graph replay (H100, both norms, bf16 and fp32, hidden 1024-8192, docs/backward.md) it
# ran 1.5-3.4 us where the few-row form took 2.0-3.7 (x1.09-1.87) on rows of 2 KB to 8 KB, and
# RMSNorm's on rows of 16 KB (x1.09-1.36); LayerNorm's lost on rows of 16 KB (x0.84, x0.80)
# and RMSNorm's on rows of 32 KB (x0.78). Vectors of eight 16-bit elements ran slower than of
# four (RMSNorm bf16 4096: 2.9-3.3 us against 2.2-2.5). On the H200 the register forms past
# that range ran 1.4-2.0x the few-row form's time too. Rows under ONE_ROW_MIN_BYTES (shorter
# than any timed) keep the few-row form.
ONE_ROW_VEC = 4
ONE_ROW_THREADS = (128, 256, 512)
ONE_ROW_MIN_BYTES = 2 * 1024
ONE_ROW_MAX_BYTES = {"layer": 8 * 1024, "rms": 16 * 1024}


# Up to REREAD_ROWS rows (a rows bucket) the column sums are formed again from the rows, in L2
# (acc="reread"), by the bulk kernel that streams many rows fastest, where it takes whole rows:
# no partial rows and no taker takes more than one row. By CUDA-graph replay (H200, both norms,
# bf16 and fp32, hidden 1024-8192, docs/backward.md) it ran x1.03-2.34 over the few-row form or
# bulk default at 64 and 256 rows but where the few-row form keeps rows of more than
# REREAD_ROW_BYTES (fp32 8192 at 64 rows: x0.76 and x0.94 against it), and lost at 1 row, where
# one cluster writes the gradients itself, and to the groups at 2-8 rows of up to 4096. Rows of
# fewer than REREAD_MIN_ROW_BYTES (shorter than the shortest timed, bf16 1024) keep their
# defaults.
REREAD_ROWS = 256
REREAD_ROW_BYTES = 16 * 1024
REREAD_MIN_ROW_BYTES = 2 * 1024


def _few_rows_form(
    problem: BackwardProblem, device: object, threads: int = FEW_THREADS
) -> Config | None:
    """The default at up to :data:`FEW_ROWS` rows of at most :data:`SPLIT_ABOVE` elements.

    A bulk-copy kernel of ``threads`` threads (:data:`FEW_THREADS`), 16-byte vectors, two
    stages, its sums in registers (else shared memory), the row split over the largest cluster
    of up to :data:`FEW_CLUSTER` blocks that leaves every thread a vector; None where none of
    these runs (before Hopper, or rows of odd sizes).
    """
    if problem.hidden > SPLIT_ABOVE:
        return None
    vec = problem.full_vec
    clusters = [c for c in CLUSTERS if c <= FEW_CLUSTER and problem.hidden // c >= threads * vec]
    for cluster in sorted(clusters, reverse=True):
        for acc in ("registers", "smem"):
            form = Config(threads, vec, "bulk", acc, 1, stages=2, cluster=cluster)
            if not check(form, problem, device):
                return form
    return None


def _one_row_form(problem: BackwardProblem, device: object) -> Config | None:
    """The default at one row where its row is 2 KB to 8 KB (16 KB for RMSNorm), or None.

    The row in registers (no bulk copy) in vectors of :data:`ONE_ROW_VEC` elements, one block of
    the fewest of :data:`ONE_ROW_THREADS` threads that runs it, its sums in registers (else
    shared memory at those threads); None where the row's size is out of that range, the vector
    does not divide it, or no such kernel runs.
    """
    row_bytes = problem.hidden * problem.itemsize
    if not ONE_ROW_MIN_BYTES <= row_bytes <= ONE_ROW_MAX_BYTES[problem.norm]:
        return None
    if problem.hidden % ONE_ROW_VEC:
        return None
    for acc in ("registers", "smem"):
        for threads in ONE_ROW_THREADS:
            form = Config(threads, ONE_ROW_VEC, "registers", acc, 1)
            if not check(form, problem, device):
                return form
    return None


def _group_base(problem: BackwardProblem, device: object, few: Config | None) -> Config | None:
    """Return the kernel whose blocks and stages the groups take, or None.

    The few-row form; where rows are too short for its block (under :data:`FEW_THREADS`
    vectors), the few-row form of the most threads, at least a warp, that give each a vector of
    the row. None for rows past :data:`SPLIT_ABOVE` elements and where no bulk-copy kernel runs
    (odd sizes, before Hopper).
    """
    if few is not None:
        return few
    vec = problem.full_vec
    threads = [t for t in THREADS if 32 <= t <= min(FEW_THREADS, problem.hidden // vec)]
    return _few_rows_form(problem, device, max(threads)) if threads else None


def _groups_form(
    problem: BackwardProblem, device: object, rows: int, few: Config | None
) -> Config | None:
    """The default at 2 to :data:`GROUP_ROWS` rows, or None where none applies.

    The blocks and stages of :func:`_group_base` as one cluster of groups, sums in registers:
    the most groups up to the rows' bucket, each a cluster of the base's blocks (fewer where
    the groups' blocks would pass :data:`MAX_CLUSTER_BLOCKS`), that leave each block at most
    :data:`GROUP_ROWS_PER_BLOCK` rows and :data:`GROUP_BLOCK_BYTES` of x. None where no such
    kernel fits.

    Args:
        problem: the problem.
        device: its device's limits.
        rows: the rows of the launch (their bucket decides).
        few: :func:`_few_rows_form` of the problem.
    """
    bucket = rows_bucket(rows)
    base = _group_base(problem, device, few) if 2 <= bucket <= GROUP_ROWS else None
    if base is None:
        return None
    for groups in sorted((g for g in GROUPS if 2 <= g <= bucket), reverse=True):
        cluster = min(base.cluster, MAX_CLUSTER_BLOCKS // groups)
        per_block = -(-bucket // groups)
        if (per_block > GROUP_ROWS_PER_BLOCK
                or per_block * problem.hidden // cluster * problem.itemsize > GROUP_BLOCK_BYTES):
            continue
        form = dataclasses.replace(base, acc="registers", cluster=cluster, groups=groups)
        if not check(form, problem, device):
            return form
    return None


def _reread_form(many: Config, problem: BackwardProblem, device: object) -> Config | None:
    """``many`` summing from the rows, where it is a bulk kernel of whole rows; else None."""
    if many.cache != "bulk" or many.cluster > 1 or many.groups > 1 or not problem.sums:
        return None
    if problem.hidden * problem.itemsize < REREAD_MIN_ROW_BYTES:
        return None
    form = dataclasses.replace(many, acc="reread")
    return None if check(form, problem, device) else form


def few_rows_default(
    problem: BackwardProblem, device: object, rows: int, many_rows: Callable[[], Config]
) -> Config | None:
    """The default at ``rows`` rows, or None where the default of many rows stands.

    At one row, where the few-row form runs (a bulk-copy kernel), :func:`_one_row_form` where
    it applies. Up to :data:`GROUP_ROWS` rows, :func:`_groups_form` where it runs; then, up to
    :data:`REREAD_ROWS` rows past one, the kernel of many rows summing from the rows
    (:func:`_reread_form`), unless the few-row form runs and the rows are of more than
    :data:`REREAD_ROW_BYTES`; else, up to :data:`FEW_ROWS` rows, :func:`_few_rows_form`.

    Args:
        problem: the problem.
        device: its device's limits.
        rows: the rows of the launch (their bucket decides).
        many_rows: the default of many rows (called where it is needed).
    """
    bucket = rows_bucket(rows)
    if bucket > REREAD_ROWS:
        return None
    few = _few_rows_form(problem, device) if bucket <= FEW_ROWS else None
    if bucket == 1 and few is not None:
        one = _one_row_form(problem, device)
        if one is not None:
            return one
    grouped = _groups_form(problem, device, rows, few)
    if grouped is not None:
        return grouped
    long_rows = problem.hidden * problem.itemsize > REREAD_ROW_BYTES
    if bucket > 1 and (few is None or not long_rows):
        reread = _reread_form(many_rows(), problem, device)
        if reread is not None:
            return reread
    return few
