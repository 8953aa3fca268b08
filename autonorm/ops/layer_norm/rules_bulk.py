"""The validity rules of the bulk-copy kernel (``cache="bulk"``) beyond the common ones.

The kernel fetches row tiles by TMA (compute capability 9.0), reads 16-byte vectors, computes
two-pass statistics over the staged tile and sizes its own grid and occupancy; the limits on
its threads and vectors keep it clear of the spills ptxas reported (docs/registers.md,
docs/bulk-kernel.md). :func:`autonorm.ops.layer_norm.rules.check` calls :func:`bulk_reasons`.
"""

from __future__ import annotations

from autonorm.ops.layer_norm.plan import Plan
from autonorm.runtime.limits import DeviceLimits

# Vectors a thread of the bulk kernel may unroll per row (half that with several rows a tile).
BULK_MAX_ITERS = 8


def bulk_reasons(plan: Plan, device: DeviceLimits) -> list[str]:
    """Return why the bulk-copy configuration of ``plan`` cannot run on ``device``."""
    config, problem, shape = plan.config, plan.problem, plan.shape
    reasons = []
    if device.cc < 90:
        reasons.append("the bulk-copy kernel needs compute capability 9.0 or newer (TMA)")
    if config.stages < 1:
        reasons.append("the bulk-copy kernel needs stages >= 1")
    if config.vec * problem.itemsize != 16:
        reasons.append("the bulk-copy kernel reads 16-byte vectors: vec must be 16 bytes")
    elif shape.skewed and config.cluster > 1 and problem.residual:
        # A cluster's blocks each copy their run of a skewed row's aligned vectors; the
        # residual add's skewed stages (h's pads, its shift) are written for one block a row.
        reasons.append(f"the bulk-copy kernel splits skewed rows over a cluster without the "
                       f"residual add only: vec {config.vec} does not divide hidden "
                       f"{problem.hidden}")
    if config.stats != "two_pass":
        # It reads the staged row from shared memory twice; one-pass Welford would save nothing.
        reasons.append("the bulk-copy kernel computes two-pass statistics only")
    if config.blocks_per_sm:
        reasons.append("the bulk-copy kernel's grid is sized by occupancy: blocks_per_sm is 0")
    if config.max_regs:
        reasons.append("the bulk-copy kernel sizes its own occupancy: max_regs is 0")
    if config.threads < 128:
        # One thread issues a block's copies and all wait on it: blocks of one or two warps
        # won nothing in sweeps of the kernel and spilled under nvcc (1 warp, fp16 4096, 16 B).
        reasons.append("the bulk-copy kernel needs at least 128 threads per block")
    if shape.threads_per_row < 32:
        # Sub-warp rows spilled at the occupancy their shared memory allows (fp16 768, 8
        # threads per row, 96 B) and won nothing in sweeps of the kernel.
        reasons.append("the bulk-copy kernel gives each row at least one warp")
    iters = shape.iters
    if config.rows_per_block > 1 and iters > BULK_MAX_ITERS // 2:
        # Several rows per block at 8 vectors per thread spilled 16-104 B even at 128
        # registers (bf16/fp16 2048); more threads per row avoid it.
        reasons.append(f"{iters} vectors per thread with several rows per block (the bulk "
                       f"kernel allows {BULK_MAX_ITERS // 2})")
    elif iters > BULK_MAX_ITERS:
        # Its loops are unrolled over a thread's vectors: at 16 vectors ptxas wanted more than
        # 128 registers (fp32 2048, 2 blocks of 256 threads: 40 B spilled), at 64 it used 255
        # and spilled 1 KB. The fastest bulk kernels all had 8 or fewer.
        reasons.append(f"{iters} vectors per thread per row (the bulk kernel unrolls at most "
                       f"{BULK_MAX_ITERS})")
    return reasons
