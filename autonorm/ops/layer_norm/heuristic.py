"""The untuned default of the LayerNorm family: a rule over the device's properties and the rows.

:func:`default_config` picks a kernel for a problem nothing was tuned for, from the device's
limits (compute capability, SMs, shared memory, L2) and the row count's power-of-two bucket
(dispatch caches a kernel per bucket, so the pick depends on the bucket only). Pure arithmetic
and :func:`autonorm.ops.layer_norm.rules.check`: no GPU, no database.

The branches and the tuned evidence each one follows (the shipped H200 winners, ``autonorm
show``; docs/results.md, docs/bulk-kernel.md, docs/l2-hints.md):

- **No row count, or compute capability under 9.0**: :func:`row_kernel_default`, the row
  kernel at about four 16-byte vectors a thread (docs/tuning.md). Without a count nothing says
  which regime a launch is in, and it is the base the CLI fills unset fields from; older GPUs
  have no bulk-copy engine and no clusters.
- **A few rows of 32 KB or more**: one row split over a cluster of 8 (then 4) 128-thread
  blocks, one stage, while rows x cluster fits the SMs (:func:`.few_rows.latency_configs`).
  At hidden 16384 (32-64 KB rows) these won rows 1 in every dtype (x1.017-1.170 over the best
  unclustered kernels) and rows 8 in fp16 and fp32; shorter rows gain nothing from the split.
  Where the bulk kernel cannot split the row (its vectors do not divide over the cluster, or
  it is skewed), the row kernel's cluster of 8 splits it unevenly
  (:func:`.few_rows.ragged_latency_configs`): 1.4-1.9x the one-block pick at 1 and 8 rows.
- **The bulk-copy kernel** for rows of 16 KB or more (16-bit 8192, fp32 4096 and up: below,
  every shipped winner is a row kernel; at 16-32 KB the bulk kernel ran x1.016-1.025 of the
  row kernel) where the rows pay for its fixed cost (3.0-3.9 us a launch against a copy's
  1.4-2.1 us: the first tile's wait, the last tiles' drain):
    - at 36 or more rows an SM (the 2^26-element winners from 16 KB rows up, 41-124 rows an
      SM, are all bulk; the LLM buckets, 4,096 rows of 4096-8192, 31 an SM, all row kernels);
    - from one row an SM, for rows of 16,384 elements or more (16384 at 512 and 4,096 rows:
      bulk in every dtype);
    - under one row an SM, for rows of 64 KB or more (fp32 16384 at 64 rows: bulk; 16-bit
      16384 there: the row kernel).
  Its shape is the winners': a row a tile up to 64 KB while there are 8 or more rows an SM,
  else 32 KB segments over a cluster (bf16 32768 and fp32 16384 whole; 128 KB rows over 4,
  256 KB over 8; fp32 16384 at 64 and 512 rows over 2); the fewest threads that keep a thread
  to 8 vectors, the kernel's limit (t128 at 16 KB, t256 at 24-32 KB, t512 at 48-64 KB, as
  every winner); stages 4 to 24 KB, 3 to 48 KB, else 2, and 2 with a cluster. Of the 26 shapes
  of the H200 grid (docs/results.md) where the rule takes the bulk kernel (with the few-rows
  split above), 23 winners are its pick exactly, two differ in stages only (bf16 65536, fp32
  32768: 3) and one is a row kernel (bf16 16384 at 8 rows, where the split ran x0.985).
- **256 rows or fewer of up to 32 KB** (not a float32 residual beside 16-bit x), checked
  before the two branches above: :func:`few_rows_config`, one row a block. Up to 8 KB at two
  vectors a thread, so that weight and bias load with x (``plan.early_affine``), or three
  where the row is three powers of two of vectors; at 8-32 KB at
  256 threads with those loads asked for (``KernelConfig.early``), or 512 threads for longer
  16-bit rows. A launch is then one block's chain of loads, reductions and stores, and its
  length, not bandwidth, is the time: at 1-256 rows of 490 and 1001 elements it took the
  default from x0.57-0.88 of the fastest peer to x0.89-1.09, and at 8-32 KB it ran x1.09 of
  the picks before it (geometric mean over 175 shapes; docs/kernels.md, few rows). 32 KB rows
  the shape gives 512 threads keep the cluster split.
- **Otherwise the row kernel**, :func:`row_kernel_default`, in fp32 one row a block (every fp32
  row-kernel winner, 768-8192, has one): at 10 of the grid's 19 shapes where the rule takes it
  it is the winner, at the others a neighbour in threads, rows a block or cache. 16-bit rows of
  64 threads (129-256 vectors) run one a 64-thread block, and off the vector grid a warp a row
  in shared memory (H100: 1072 from 72% of copy to 97%, skewed 1333 from 50% to 86%). Short skewed
  16-bit LayerNorm rows (16 threads a row) with weight and bias and no residual add load them
  early (fp16 490, H100: 65% of copy to 85%).
- **keep_x** (x's loads kept in L2) where x is at least twice the L2, in the bulk kernel and in
  the row kernel on rows of up to 8 KB: every winner at 2^26 elements of those holds it (bulk
  x1.020-1.042, row kernel at 768-4096 x1.005-1.024); row kernels of 16-32 KB rows gained
  nothing (x0.988-1.009), nor did the latency and LLM buckets (x0.966-1.005), whose x is 64 MB
  or less (the H200's L2 is 60 MB).

Rows off the vector grid (skewed rows, docs/kernels.md) take the unclustered bulk kernel up to
64 KB a row, at two stages, at 36 or more rows an SM from 4 KB a row, where the row kernel runs
them 1.1x-2.2x slower at most sizes, and 16-bit ones of 2-4 KB in tiles of several rows
(LayerNorm's, and RMSNorm's past 256 aligned vectors; H100: 1031 from 80% of copy to 86%), and
shorter 16-bit ones in tiles too, from 38-62 aligned vectors by norm (H100: 1013 from 57% to
91%, 390 from 52% to 80%);
from one row an SM, past 64 KB and up to 256 KB without the residual add, a cluster of it in
runs of their aligned vectors. fp32 LayerNorm rows of
8-24 KB at 36 or more rows an SM take the bulk kernel at two stages. The bulk picks are
:mod:`.bulk_picks`'. Every pick passes ``check``; where the bulk kernel cannot run the problem
(too little shared memory) the rule falls through to the row kernel.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator

from autonorm.errors import ConfigError
from autonorm.ops.base import rows_bucket
from autonorm.ops.layer_norm.bulk_picks import (
    bulk_configs,
    bulk_pays,
    keeps_x,
)
from autonorm.ops.layer_norm.config import CLUSTERS, VECS, KernelConfig
from autonorm.ops.layer_norm.few_rows import (
    few_rows_config,
    latency_configs,
    ragged_latency_configs,
)
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.rules import check, welford_run_cap
from autonorm.runtime.limits import H200, DeviceLimits

KB = 1024

# A few rows of this many bytes or more are split over a cluster of 8 or 4 blocks.
LATENCY_MIN_ROW_BYTES = 32 * KB

# Row-kernel rows of up to this many bytes take keep_x where x is large (bulk_picks.keeps_x).
ROW_KEEP_X_MAX_BYTES = 8 * KB


def default_config(
    problem: Problem, device: DeviceLimits = H200, rows: int | None = None
) -> KernelConfig:
    """Return the untuned configuration for ``problem`` on ``device`` (the module's rule).

    Args:
        problem: the hidden size, dtype and affine flags.
        device: the GPU's limits.
        rows: the row count of the launch (its power-of-two bucket decides), or None.

    Raises:
        ConfigError: no configuration can run the problem on the device.

    """
    if rows is None or device.cc < 90:
        return row_kernel_default(problem, device)
    bucket = rows_bucket(rows)
    # Before the clustered and bulk picks: a few rows of up to 32 KB run fastest one a block,
    # but where a 32 KB row takes 512 threads the split keeps its lead (H200, one row: 16-bit
    # 16384 x1.06-1.14 but RMSNorm's x0.93; fp32 LayerNorm's fused add at 8192 x1.25).
    few = few_rows_config(problem, bucket, device)
    row_bytes = problem.hidden * problem.itemsize
    if few is not None and (few.threads == 256 or row_bytes < LATENCY_MIN_ROW_BYTES):
        return few
    for config in _hopper_candidates(problem, device, bucket):
        if not check(config, problem, device):
            return config
    return _row_kernel(problem, device, bucket, few)


def row_kernel_default(problem: Problem, device: DeviceLimits = H200) -> KernelConfig:
    """Return a sound row-kernel configuration for any hidden size, without tuning.

    Aims at about four 16-byte vectors per thread, the measured sweet spot of the untuned
    kernel, and a register cache where it fits; in 16-bit under the 64-register cap (see
    ``_capped``; docs/tuning.md). The rule's pick without a row count or before Hopper, and
    the centre of the search's seeds.

    Raises:
        ConfigError: no configuration can run the problem on the device.

    """
    vec = problem.max_vec
    vectors = math.ceil(problem.hidden / vec)
    tpr = min(1024, max(1, 1 << math.ceil(math.log2(max(1, math.ceil(vectors / 4))))))
    rows = min(32, max(1, 128 // tpr))
    threads = tpr * rows
    for cache, stats in (("registers", "two_pass"), ("smem", "two_pass")):
        cfg = KernelConfig(threads, vec, rows, cache, stats, 1, 0)
        if not check(cfg, problem, device):
            return _capped(cfg, problem, device)
    if problem.hidden % vec and threads > 512:
        # Skewed rows spill at 1024 threads (rules_registers): the same row over 512 threads,
        # before a cluster's split.
        for cache in ("registers", "smem"):
            cfg = KernelConfig(512, vec, 1, cache, "two_pass", 1, 0)
            if not check(cfg, problem, device):
                return _capped(cfg, problem, device)
    # Rows past one block's shared memory: split across a cluster (Hopper) and keep the two-pass
    # statistics (Welford without a cache re-reads x from global memory to normalize); skewed
    # rows at 512 threads, where 1024 spill.
    for cluster, width in itertools.product(CLUSTERS[1:], (1024, 512)):
        cfg = KernelConfig(width, vec, 1, "smem", "two_pass", cluster, 0)
        if not check(cfg, problem, device):
            return cfg
    if problem.residual:
        # What follows is uncached, which the residual add cannot run in (rules).
        row_bytes = problem.hidden * problem.itemsize
        clusters = "" if device.cc >= 90 else " and no thread-block clusters"
        raise ConfigError(
            f"unsupported hidden size {problem.hidden} ({problem.dtype}) with the residual add "
            f"on {device.name}: the add needs the row held in registers or shared memory, and "
            f"a row of {row_bytes:,} bytes fits neither ({device.max_smem_optin:,} bytes of "
            f"shared memory a block{clusters}); add the residual first and run the plain norm"
        )
    # Uncached, x is read again to normalize: LayerNorm by Welford (a two-pass would read it
    # three times), RMSNorm by its one statistic (its stats field takes no other value).
    stats = "two_pass" if problem.norm == "rms" else "welford"
    cfg = KernelConfig(threads, vec, rows, "none", stats, 1, 0)
    if not check(cfg, problem, device):
        return cfg
    # Very long rows: welford without a cache fits in one block up to its run cap (fp32: 2048
    # elements per thread, WELFORD_RUN_MAX); past it split the row across a cluster, of 512-thread
    # blocks where 1024 would spill, with narrower vectors where the widest do not divide.
    for vec_try in (v for v in VECS[::-1] if v <= vec):
        for cluster in CLUSTERS:
            for threads in (1024, 512):
                cfg = KernelConfig(threads, vec_try, 1, "none", stats, cluster, 0)
                if not check(cfg, problem, device):
                    return cfg
    if problem.norm == "rms":
        raise ConfigError(
            f"unsupported hidden size {problem.hidden} ({problem.dtype}): no configuration can "
            f"run it on {device.name}: {'; '.join(check(cfg, problem, device))}")
    cap = welford_run_cap(problem)
    reach = (f"a cluster of {max(CLUSTERS)} blocks holds too few threads" if device.cc >= 90
             else "that needs a thread-block cluster (compute capability 9.0 or newer)")
    raise ConfigError(
        f"unsupported hidden size {problem.hidden} ({problem.dtype}): no configuration can run it "
        f"on {device.name}: a {problem.dtype} Welford run is at most {cap:,} elements per "
        f"thread, and for a row of {problem.hidden:,} elements {reach}"
    )


def _capped(config: KernelConfig, problem: Problem, device: DeviceLimits) -> KernelConfig:
    """Return the 16-bit row-kernel default under the 64-register cap (fp32 stays as it is).

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


def _row_kernel(
    problem: Problem, device: DeviceLimits, bucket: int, few: KernelConfig | None
) -> KernelConfig:
    """The row kernel's default on Hopper: the few-row shape ``few``, else the row kernel's."""
    if few is not None:
        return few
    config = row_kernel_default(problem, device)
    # 16-bit rows of 64 threads (1025-2048 elements) ran 71-94% of copy two a 128-thread block
    # and 97-98% one a 64-thread block; off the vector grid 48-78%, and 80-88% a warp a row with
    # the row in shared memory, in LayerNorm, RMSNorm and the fused add alike (H100, 2^26
    # elements; docs/kernels.md). fp32 rows of 32 threads and more ran fastest alone too.
    skewed = problem.hidden % config.vec
    if problem.itemsize == 2 and skewed and config.threads_per_row == 64:
        warp = dataclasses.replace(config, threads=128, rows_per_block=4, cache="smem")
        if not check(warp, problem, device):
            config = warp
    alone_from = 32 if problem.itemsize == 4 else 64
    if config.rows_per_block > 1 and config.threads_per_row >= alone_from:
        alone = dataclasses.replace(config, threads=config.threads_per_row, rows_per_block=1)
        if not check(alone, problem, device):
            config = alone
    short_skewed = skewed and config.threads_per_row == 16
    timed_form = problem.norm == "layer" and problem.has_weight and problem.has_bias
    if timed_form and not problem.residual and problem.itemsize == 2 and short_skewed:
        # Short 16-bit LayerNorm rows off the vector grid (16 threads a row: up to 64 vectors)
        # load weight and bias beside x where the rules allow: left to nvcc, fp16 490's store
        # pass loaded them in three rounds between its stores (H100: 65% of copy, 85% early;
        # bf16 level; docs/kernels.md). At 1001 (32 threads a row) they moved neither dtype;
        # the other affine forms, the residual add and RMSNorm were not timed with them.
        early = dataclasses.replace(config, early=True)
        if not check(early, problem, device):
            config = early
    hinted = dataclasses.replace(config, keep_x=True)
    short = problem.hidden * problem.itemsize <= ROW_KEEP_X_MAX_BYTES
    if short and keeps_x(problem, device, bucket) and not check(hinted, problem, device):
        return hinted
    return config


def _hopper_candidates(
    problem: Problem, device: DeviceLimits, bucket: int
) -> Iterator[KernelConfig]:
    """The clustered and bulk-copy picks for ``bucket`` rows, best first (maybe invalid)."""
    row_bytes = problem.hidden * problem.itemsize
    if row_bytes >= LATENCY_MIN_ROW_BYTES:
        yield from latency_configs(problem, bucket, device)
        yield from ragged_latency_configs(problem, bucket, device)
    if bulk_pays(problem, device, bucket):
        yield from bulk_configs(problem, device, bucket)
