"""The few-row shape of the row kernel: one row a block, the launch's chain kept short.

At 256 rows or fewer a launch is one block's chain of loads, reductions and stores, and its
length, not bandwidth, is the time. :func:`few_rows_config` gives each row a block: up to 8 KB
a row at two vectors a thread, so that weight and bias load beside x by themselves
(``plan.early_affine``), or at three with those loads asked for where the row is three powers
of two of vectors; at 8-32 KB at 256 threads with those loads asked for
(``KernelConfig.early``), or at 512. :mod:`.heuristic`'s default takes it before its other
branches (docs/kernels.md, few rows). Rows of 32 KB and more split over a cluster instead, one
row to a cluster: :func:`latency_configs` (the bulk kernel's equal segments) and
:func:`ragged_latency_configs` (the row kernel's runs, for rows the bulk kernel cannot split).

Pure arithmetic and :func:`autonorm.ops.layer_norm.rules.check`: no GPU, no database.
"""

from __future__ import annotations

import dataclasses
import math

from autonorm.ops.layer_norm.config import CLUSTERS, VECS, KernelConfig
from autonorm.ops.layer_norm.plan import EARLY_AFFINE_ITERS, derive_plan
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.rules import check
from autonorm.ops.layer_norm.shape import derive_shape
from autonorm.runtime.limits import H200, DeviceLimits

KB = 1024

# Rows buckets up to FEW_ROWS of rows up to FEW_ROWS_MAX_ROW_BYTES take the few-row shape at two
# vectors a thread; rows up to FEW_ROWS_LONG_ROW_BYTES take it at 256 threads (512 for 16-bit
# rows past LONG_ROW_16BIT_ITERS vectors a thread) with the weights loaded early.
FEW_ROWS = 256

FEW_ROWS_MAX_ROW_BYTES = 8 * KB

FEW_ROWS_LONG_ROW_BYTES = 32 * KB

LONG_ROW_16BIT_ITERS = 4

# fp32 rows after the residual add past this many vectors a thread at 256 threads take 512, in
# rows buckets from LONG_ROW_ADDED_FP32_MIN_ROWS while a block an SM holds every row, where 512
# threads divide the row's vectors.
LONG_ROW_ADDED_FP32_ITERS = 4

LONG_ROW_ADDED_FP32_MIN_ROWS = 64

# Rows on the grid split over a cluster take 512 threads, not 256, where 256 would hold at least
# this many vectors a thread and 512 two or fewer (fp32 LayerNorm: where 512 fuse its sums).
SPLIT_512_MIN_ITERS = 4

# 16-bit rows of three powers of two of 16-byte vectors take three 8-byte vectors a thread up to
# this many threads a row.
HALF_VECTOR_MAX_THREADS = 128

# The most 32-bit registers' worth of x, residual, weight and bias a thread of the long-row shape
# holds at once: LayerNorm's fused add at fp32 8192 (128 at 256 threads) ran x0.73-0.93 of the
# kernels before it, the shapes at 96 or fewer x1.00-1.36.
EARLY_MAX_WORDS = 96


def few_rows_config(
    problem: Problem, bucket: int, device: DeviceLimits = H200
) -> KernelConfig | None:
    """Return the row kernel's shape for a few short rows, or None where it does not apply.

    One row a block, the widest vector that divides the row (two elements at least: odd rows
    take a skewed pair; a wider one where that needs more threads than the cap), and the
    threads, a power of two, that give each two vectors or one:
    weight and bias then load beside x (``plan.early_affine``). More threads would run more
    warps through each reduction's barrier; more vectors a thread, a longer chain. The cap is
    512 threads for 16-bit rows while a block an SM holds every row, else 256 (a 512-thread
    block holding the weights as well took more registers than two blocks an SM allow, and
    256 rows then ran in two waves); past it, None. Rows of three powers of two of vectors
    take :func:`_three_vectors_config` where it won; rows of FEW_ROWS_MAX_ROW_BYTES to
    FEW_ROWS_LONG_ROW_BYTES take :func:`_long_few_rows_config`.

    On the H200 (CUDA-graph replay, against the fastest of torch eager, torch.compile and
    Liger) LayerNorm at 1-256 rows of 490 and 1001 elements went from x0.57-0.88 to x0.89-1.09
    in every dtype; with the residual add (RMSNorm and LayerNorm, 490-4096) the shape ran
    1.23x as fast as the default before it (geometric mean); docs/kernels.md (few rows). A
    float32 residual beside 16-bit x (``residual_dtype``) was not timed with it, so it keeps
    the default.
    """
    row_bytes = problem.hidden * problem.itemsize
    if problem.wide_residual or bucket > FEW_ROWS or row_bytes > FEW_ROWS_LONG_ROW_BYTES:
        return None
    if row_bytes > FEW_ROWS_MAX_ROW_BYTES:
        return _long_few_rows_config(problem, bucket, device)
    dividing = max(v for v in VECS if v <= problem.max_vec and problem.hidden % v == 0)
    cap = 512 if problem.itemsize == 2 and bucket <= device.sm_count else 256
    for vec in (v for v in VECS if max(dividing, 2) <= v <= problem.max_vec):
        threads = 1 << max(0, math.ceil(math.log2(math.ceil(problem.hidden / vec / 2))))
        if threads <= cap:
            config = KernelConfig(threads, vec, 1, "registers", "two_pass", 1, 0)
            if threads < 64 or check(config, problem, device):
                return None
            three = _three_vectors_config(problem, vec, device)
            return three or config
    return None


def _three_vectors_config(problem: Problem, vec: int, device: DeviceLimits) -> KernelConfig | None:
    """Three vectors a thread with the early loads, where the row is three powers of two of them.

    A row of 3 x 2^k vectors (768, 1536, 3072 in 16-bit; 768, 1536 in fp32) over the power of
    two of threads that gives each two vectors or one leaves the second pass half empty;
    2^k threads of three vectors each fill every pass. On the H200 (CUDA-graph replay, rows 1,
    64 and 256, against the two-vector shape in the same run) it ran x1.09-1.16 for fp32
    RMSNorm and LayerNorm and RMSNorm after the add, x1.04-1.16 for 16-bit rows after either
    add, x1.01-1.06 for 16-bit LayerNorm; it lost for fp32 LayerNorm after the add
    (x0.96-0.99), which keeps two vectors.

    16-bit rows up to HALF_VECTOR_MAX_THREADS threads of 8-byte vectors (768 and 1536) take
    those: twice the threads, three 8-byte vectors each. Against the shapes before it (rows
    1-256, same run) that ran x0.99-1.06 for LayerNorm and either add (4 of 60 shapes under
    x1.00), and at 3072 it lost at 28 of 32 shapes (x0.92-1.05). 16-bit RMSNorm without the
    add, where three 16-byte vectors lost to two (bf16 768 x0.91), takes them two rows a block:
    x1.00-1.13 of its two-vector shape, where one row a block ran x0.93-0.94 in bf16
    (docs/kernels.md, few rows).
    """
    vectors, left = divmod(problem.hidden, vec)
    threads, third = divmod(vectors, 3)
    affine = problem.has_weight or problem.has_bias
    if left or third or threads < 32 or threads & (threads - 1) or not affine:
        return None
    if problem.itemsize == 4 and problem.norm == "layer" and problem.residual:
        return None
    rows = 1
    bare_rms = problem.norm != "layer" and not problem.residual
    if problem.itemsize == 2 and 2 * threads <= HALF_VECTOR_MAX_THREADS:
        vec, threads, rows = vec // 2, 2 * threads, 2 if bare_rms else 1
    elif problem.itemsize == 2 and bare_rms:
        return None
    config = KernelConfig(threads * rows, vec, rows, "registers", "two_pass", 1, 0, early=True)
    return None if check(config, problem, device) else config


def _long_few_rows_config(
    problem: Problem, bucket: int, device: DeviceLimits
) -> KernelConfig | None:
    """The few-row shape for rows of 8-32 KB: 16-byte vectors, 256 threads, early weight loads.

    Two vectors a thread would take 512-2048 threads, and more warps through each reduction's
    barrier cost more than the longer chain: at 1-64 rows of fp32 4096 and 8192 and bf16 8192
    on the H200, 256 threads at 4-8 vectors with the weights loaded beside x ran x1.03-1.05 of
    512 at half as many. 512 threads take the rows that 256 cannot: 16-bit rows past
    LONG_ROW_16BIT_ITERS vectors a thread (bf16 16384: x1.03 of 256 threads at 8), skewed rows
    past what a skewed register cache holds, rows whose early loads would hold more than
    EARLY_MAX_WORDS registers' worth a thread, and fp32 rows after the add past
    LONG_ROW_ADDED_FP32_ITERS that 512 threads divide, at 64 rows or more
    (:func:`_added_fp32_takes_512`); all while a block an SM holds every row. The
    early loads are left to fp32 at 512 threads (16-bit: x0.97) and to rows on the vector grid
    (fp16 6001: x0.95-0.97). Docs/kernels.md (few rows) has the figures.
    """
    for threads in (256, 512):
        if threads == 512 and bucket > device.sm_count:
            break
        config = KernelConfig(threads, problem.max_vec, 1, "registers", "two_pass", 1, 0)
        shape = derive_shape(config, problem)
        if problem.itemsize == 2 and threads == 256 and shape.iters > LONG_ROW_16BIT_ITERS:
            continue
        if threads == 256 and _added_fp32_takes_512(problem, bucket, shape.iters, device):
            continue
        affine = problem.has_weight or problem.has_bias
        if affine and shape.iters > EARLY_AFFINE_ITERS and not shape.skewed and (
                threads == 256 or problem.itemsize == 4):
            if _early_words(problem, shape.iters * config.vec) > EARLY_MAX_WORDS:
                continue
            config = dataclasses.replace(config, early=True)
        if not check(config, problem, device):
            return config
    return None


def _added_fp32_takes_512(
    problem: Problem, bucket: int, iters: int, device: DeviceLimits
) -> bool:
    """Whether fp32 rows after the add, ``iters`` vectors a thread at 256, take 512 threads.

    On the H200 (CUDA-graph replay, same run) RMSNorm after the add at 6144 and 8192 ran
    x1.02-1.07 of 256 threads at 64-128 rows (LayerNorm's at 6144: x0.99-1.03) but x0.97-1.01
    at 1-8 rows; at 5120, whose 1280 vectors leave 512 threads' last pass half empty, x0.85-0.97.
    """
    return (problem.itemsize == 4 and problem.residual and iters > LONG_ROW_ADDED_FP32_ITERS
            and LONG_ROW_ADDED_FP32_MIN_ROWS <= bucket <= device.sm_count
            and problem.hidden % (512 * problem.max_vec) == 0)


def _early_words(problem: Problem, elements: int) -> int:
    """32-bit registers a thread holds with early loads: its x (or h), residual and affine."""
    streams = 1 + int(problem.residual) + int(problem.has_weight) + int(problem.has_bias)
    return streams * elements * problem.itemsize // 4


def latency_configs(problem: Problem, rows: int, device: DeviceLimits = H200) -> list[KernelConfig]:
    """Each row split over a cluster of 8 (then 4) blocks of 128 threads, one stage each.

    With fewer rows than SMs most SMs idle, and a row's time is one block's chain of load,
    reduce and store; split over 8 blocks of 128 threads (one stage: the row's slice loaded once
    by the bulk engine) each chain is an eighth as long. Head to head at hidden 16384 (H200):
    rows 1 x1.017 (bf16), x1.063 (fp16), x1.170 (fp32) of the winners tuned without them; rows 8
    x1.013 (fp16), x1.086 (fp32), bf16 x0.985; rows 64 x0.84-0.93, so they stop where the
    blocks would outnumber the SMs (docs/tuning.md). Valid ones only; none before Hopper.
    """
    vec = problem.full_vec
    if device.cc < 90 or not problem.on_vector_grid:
        # Skewed rows: the bulk kernel's runs of them are untimed at a few rows, the row
        # kernel's (ragged_latency_configs) measured.
        return []
    configs = []
    for cluster in (8, 4):
        cfg = KernelConfig(128, vec, 1, "bulk", "two_pass", cluster, 0, 1)
        if rows * cluster <= device.sm_count and not check(cfg, problem, device):
            configs.append(cfg)
    return configs


def ragged_latency_configs(
    problem: Problem, rows: int, device: DeviceLimits = H200
) -> list[KernelConfig]:
    """Each row over a cluster of 8 row-kernel blocks, where the bulk kernel's split is refused.

    The bulk kernel's clusters take rows of whole vectors only (:func:`latency_configs`); the
    row kernel's split any row, the last block taking the rest of it. One run on an H100
    (CUDA-graph replay, 1 and 8 rows, no database), against the one-block pick before it:
    fp32 26531 9.6 -> 5.8 us (torch.compile 5.9), 27656 6.1 -> 5.2 (4.7), 40001 12.0 -> 6.5
    (5.7); bf16 26531 6.3 -> 4.2 (6.0), 27656 4.8 -> 3.4 (4.7); at 8 rows fp32 x1.04-1.12 of
    torch.compile. A register row cache, of 512 threads for skewed rows (the best there) and
    256 for rows on the grid (512 ran x0.87 at bf16 27656), but 512 for rows on the grid where
    that shortens the chain enough to pay for the wider barriers (:func:`_splits_at_512`);
    shared memory where the registers do not hold the run. None before Hopper, nor where
    rows x 8 outnumber the SMs.
    """
    cluster = CLUSTERS[-1]
    if device.cc < 90 or rows * cluster > device.sm_count:
        return []
    wide = problem.hidden % problem.max_vec or _splits_at_512(problem, cluster, device)
    threads = 512 if wide else 256
    configs = []
    for cache in ("registers", "smem"):
        cfg = KernelConfig(threads, problem.max_vec, 1, cache, "two_pass", cluster, 0)
        if not check(cfg, problem, device):
            configs.append(cfg)
    return configs


def _splits_at_512(problem: Problem, cluster: int, device: DeviceLimits) -> bool:
    """Whether a row on the grid splits over a cluster of 512-thread blocks, not 256.

    In a cluster each reduction is also a cluster barrier, and a thread's vectors are a serial
    chain of loads and sums; 512 threads halve the chain and put twice the warps through each
    barrier. fp32 LayerNorm takes 512 where 256 threads would hold more than two vectors a
    thread and 512 two or fewer: there its row kernel loads weight and bias beside x and sums
    the row in one reduction (``plan.fused_passes``), not two. H100, one run
    (`benchmarks/explore.py --rows 1`, then `--rows 8`): 20004 5.2 -> 4.1 us and 5.9 -> 4.6,
    27656 5.9 -> 4.1 and 6.3 -> 4.8; where 256 already hold two vectors (12292) 512 ran
    x0.85-0.86, and where neither does (49160) x1.00. The other rows take 512 where it
    halves a chain of four or more vectors to two or fewer (SPLIT_512_MIN_ITERS): 16-bit
    LayerNorm 49160 x1.09-1.13, fp32 LayerNorm after the add 27656 x1.16-1.18 and fp32 RMSNorm
    27656 x1.02-1.03; in another run on an H100, bf16 49160 after either add and in RMSNorm
    and fp32 24584-27656 after either add x1.10-1.23. From three vectors to two it did not pay
    throughout (fp32 RMSNorm 20004 x1.02-1.03, LayerNorm after the add 20004 x0.98-1.00), from
    two to one it lost (bf16 27656 x0.87): those keep 256. Docs/kernels.md (ragged clusters)
    has the figures.
    """
    plans = [derive_plan(KernelConfig(t, problem.max_vec, 1, "registers", "two_pass", cluster, 0),
                         problem, device) for t in (256, 512)]
    if problem.norm == "layer" and problem.itemsize == 4 and not problem.residual:
        return not plans[0].fused_passes and plans[1].fused_passes
    return plans[0].shape.iters >= SPLIT_512_MIN_ITERS and plans[1].shape.iters <= 2
