"""The search space: problems, kernel configurations, validity rules and enumeration.

A :class:`Problem` is what the user asks for (hidden size, dtype, affine flags). A
:class:`KernelConfig` is one point of the template family. :func:`check` says why a
configuration cannot run a problem on a device, before anything is compiled;
:func:`enumerate_space` lists every valid configuration and :func:`default_config` picks a sound
one for any hidden size without tuning.

Pure logic: no CuPy, no GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.problem import Problem
from autonorm.runtime.limits import H200, DeviceLimits

OTHER_REGS = 40

# Shared memory the kernel needs besides the row cache: reduction scratch, 2 buffers x 32 warps x
# 4 floats (Welford's count, shift, mean and M2), plus the cluster exchange slots.
SCRATCH_SMEM = 2 * 32 * 4 * 4 + 2 * 4 * 4

# The bulk-copy kernel's registers besides weights held in registers, and the most weight/bias
# vectors it holds per thread. ptxas -v on sm_90 (lab sweep, 2026-11-29): with weights of 8
# vectors in registers and a cluster of 2 a 512-thread kernel fit 128 registers without spills;
# without weights 64 registers always sufficed.
BULK_OTHER_REGS = 40

BULK_MAX_WEIGHT_ITERS = 8


def bulk_scratch_bytes(stages: int, rows_per_block: int, cluster: int = 1) -> int:
    """Shared memory of the bulk-copy kernel besides its stages.

    That is the stages' mbarriers (a cluster: two more for the exchange), the reduction scratch
    ([2][32][2] floats), the cluster exchange slots ([2][rows][cluster][4] floats), the ring of
    claimed tiles (Q = max(2 x stages, 4) mbarriers and ints) and each stage's tile (ints).
    """
    exchange = 2 * 8 if cluster > 1 else 0
    ring = max(2 * stages, 4)
    return (stages * 8 + exchange + 2 * 32 * 2 * 4 + 2 * rows_per_block * max(cluster, 1) * 4 * 4
            + ring * (8 + 4) + stages * 4)


@dataclass(frozen=True)
class Shape:
    """Derived per-thread work of a configuration on a problem (what the template unrolls)."""

    segment: int  # elements of a row that one block handles (hidden / cluster)
    threads_per_row: int
    iters: int  # vector accesses per thread per row
    cache_regs: int  # 32-bit registers a thread spends on a register row cache
    smem_cache_bytes: int  # bytes of shared memory for a shared-memory row cache
    vec: int  # elements per vector access

    @property
    def even(self) -> bool:
        """True when the vectors tile the segment exactly (no tail guard needed)."""
        return self.segment == self.iters * self.threads_per_row * self.vec


def derive_shape(config: KernelConfig, problem: Problem) -> Shape:
    """Compute the per-thread work of ``config`` on ``problem`` (no validity checks)."""
    segment = problem.hidden // max(config.cluster, 1)
    tpr = max(config.threads // max(config.rows_per_block, 1), 1)
    vectors = math.ceil(segment / config.vec)
    iters = math.ceil(vectors / tpr)
    vec_bytes = config.vec * problem.itemsize
    cache_regs = iters * math.ceil(vec_bytes / 4)
    smem = config.rows_per_block * segment * problem.itemsize
    return Shape(segment, tpr, iters, cache_regs, smem, config.vec)

# A shared-memory row cache is filled by cp.async (LDGSTS, compute capability 8.0+) when a thread
# copies more than this many vectors per row: the plain fill stages them through registers four
# at a time (``#pragma unroll 4``), so longer rows wait for several round trips, while cp.async
# puts every copy in flight at once. A/B on the H200 (NOTES.md 39): x1.02-1.08 on 16-bit smem
# kernels of 6-8 vectors per thread (bf16 12288 t256v8r1 85.7% -> 88.3% of copy, 16384 85.3% ->
# 86.9%), fp32 8192 t256v4r1 x1.047; at 4 vectors or fewer x0.986-1.009 (the winners at 768-8192
# among them), so those keep the plain fill.
ASYNC_FILL_ITERS = 4


def fills_async(config: KernelConfig, problem: Problem, device: DeviceLimits = H200) -> bool:
    """Whether a shared-memory row cache is filled by cp.async instead of through registers."""
    return (
        config.cache == "smem" and device.cc >= 80
        # cp.async copies 4, 8 or 16 bytes: not one 16-bit element
        and config.vec * problem.itemsize >= 4
        and derive_shape(config, problem).iters > ASYNC_FILL_ITERS
    )


def smem_bytes(config: KernelConfig, problem: Problem) -> int:
    """Dynamic shared memory a launch of ``config`` needs, in bytes."""
    if config.cache == "bulk":
        stages = max(config.stages, 1)
        return bulk_stage_bytes(config, problem) + bulk_scratch_bytes(
            stages, config.rows_per_block, config.cluster)
    shape = derive_shape(config, problem)
    cache = shape.smem_cache_bytes if config.cache == "smem" else 0
    return cache + SCRATCH_SMEM


def bulk_stage_bytes(config: KernelConfig, problem: Problem) -> int:
    """Shared memory of the bulk-copy kernel's stages: stages x rows per tile x segment bytes."""
    return max(config.stages, 1) * derive_shape(config, problem).smem_cache_bytes


def prefetches(config: KernelConfig) -> bool:
    """True when the kernel loads the next row while it finishes this one.

    A persistent grid (blocks_per_sm > 0) with a register cache holds two rows per thread: the
    one being normalized and the next one, whose loads are in flight meanwhile.
    """
    return config.cache == "registers" and config.blocks_per_sm > 0


def bulk_occupancy(
    config: KernelConfig, problem: Problem, device: DeviceLimits = H200
) -> tuple[int, bool]:
    """Blocks per SM the bulk-copy kernel is built for, and whether it holds weights in registers.

    Shared memory (the stages) and threads decide how many blocks fit an SM, and the kernel's
    register need may allow fewer; the ``__launch_bounds__`` minimum is the count reached. Weight
    and bias stay in registers (4 per 16-byte vector each) when that costs no block of it.
    """
    smem = smem_bytes(config, problem)
    by_smem = device.smem_per_sm // (smem + 1024)  # the driver reserves 1 KB per block
    by_threads = device.max_threads_per_sm // config.threads
    target = max(1, min(by_smem, by_threads, 32))
    shape = derive_shape(config, problem)
    iters = shape.iters
    # Unrolled loops keep about a vector's four registers per vector in flight; ragged tails
    # keep masks and indices live.
    base = BULK_OTHER_REGS + 4 * iters + (8 if config.cluster > 1 else 0)
    if not shape.even:
        base += 8
    affine = int(problem.has_weight) + int(problem.has_bias)
    # With weights in registers ptxas unrolls less: 512 threads, 8 vectors of weight and bias
    # and a cluster of 2 fit 128 registers without spills (lab sweep), so the weights replace
    # the in-flight term rather than add to it.
    with_weights = base - 4 * iters + 4 * iters * affine
    if config.rows_per_block > 1:  # 2048, 4-16 rows of a warp, 8 vectors: 16-104 B spilled
        with_weights += 32

    def fits(need: int, blocks: int) -> bool:
        # 8 registers of margin, allocation in units of 8, and registers split per scheduler
        # quarter of the SM (as in min_blocks_per_sm): at the bare estimate 32-72-register
        # caps spilled 4-28 bytes (nvcc 13.0 sweeps of bulk kernels, 2026-11-29).
        need = -(-(need + 8) // 8) * 8
        warps = max(1, config.threads // 32)
        per_quarter = -(-(warps * blocks) // 4)
        return need <= 255 and per_quarter * 32 * need <= device.regs_per_sm // 4

    # The blocks the kernel's own registers allow, then weights in registers if they fit there.
    # Deciding the weights at the target instead (shared memory's count, which the registers may
    # not reach) ran t256 c2 s2 at bf16 32768 with 2 blocks and its weights read from L1 every
    # row: x0.984 of the same kernel with them in registers; t256 c4 s2 at bf16 65536 x0.956
    # (H200, single launches; NOTES.md 77).
    blocks = target
    while blocks > 1 and not fits(base, blocks):
        blocks -= 1
    wreg = affine > 0 and iters <= BULK_MAX_WEIGHT_ITERS and fits(with_weights, blocks)
    return blocks, wreg


def register_estimate(config: KernelConfig, problem: Problem) -> int:
    """Registers per thread a configuration needs, estimated (an upper bound in practice).

    The rest of the kernel needs about OTHER_REGS; a register row cache adds its elements as
    fp32 values (the compiler converts early), Welford's running triplets and divides about half
    as much again, and a cluster's extra reductions 16. Fitted to the nvcc 13.0 sm_90 sweep of
    2026-11-29 (420 kernels): every register-cache kernel admitted compiled without spills.
    """
    need = OTHER_REGS + (16 if config.cluster > 1 else 0)
    per_elem = 1.5 if config.stats == "welford" else 1.25
    if config.cache == "registers":
        elems = derive_shape(config, problem).iters * config.vec
        if prefetches(config):
            elems *= 2  # the next row is held too
    else:
        elems = 4 * config.vec  # the loops are unrolled 4 vectors deep
    return need + int(elems * per_elem)


def min_blocks_per_sm(config: KernelConfig, problem: Problem, device: DeviceLimits = H200) -> int:
    """The ``__launch_bounds__`` minimum blocks per SM: as many as the register estimate allows.

    Without it ptxas guessed: at 512 threads it capped a kernel at 32 registers and spilled 4 KB;
    with a minimum of 1 it gave a 128-thread kernel 128 registers, so only 4 blocks fit an SM and
    it ran at 75% instead of ~85% of copy bandwidth (H200, bf16 4096, 2026-11-29).
    """
    if config.cache == "bulk":
        return bulk_occupancy(config, problem, device)[0]
    # 32 registers of margin: with 0 or 16 ptxas still spilled some (420-kernel sweeps).
    need = -(-register_estimate(config, problem) // 8) * 8 + 32
    # Registers are allocated per warp-scheduler quarter of the SM (regs_per_sm / 4 each), so
    # count warps per quarter: with one-warp blocks the whole-SM division promised ~100
    # registers where ptxas could give 96 and spilled (fp32 sweep of 9,156 kernels).
    warps = max(1, config.threads // 32)
    warps_per_quarter = (device.regs_per_sm // 4) // (32 * need)
    by_regs = (4 * warps_per_quarter) // warps
    return max(_resident(by_regs, config, device), capped_blocks(config, device))


def _resident(blocks: int, config: KernelConfig, device: DeviceLimits) -> int:
    """``blocks`` per SM within what the SM holds: its threads, 32 blocks, and at least 1."""
    return max(1, min(blocks, device.max_threads_per_sm // config.threads, 32))


def capped_blocks(config: KernelConfig, device: DeviceLimits = H200) -> int:
    """Blocks per SM that hold a thread to ``config.max_regs`` registers (0 when uncapped).

    ``__launch_bounds__(threads, k)`` makes ptxas fit k blocks in the SM's registers, so k =
    regs_per_sm / (threads x max_regs) caps a thread at max_regs.
    """
    if not config.max_regs:
        return 0
    return _resident(device.regs_per_sm // (config.threads * config.max_regs), config, device)

# A 16-bit register row cache is held as fp32 (converted once, not once per pass) up to this
# many elements per thread. Measured on the H200 (NOTES.md, 15): x1.03-1.14 on register-cached
# bf16/fp16 kernels at 1024-4096; ptxas gave t128v8r4 at 1024 96 registers instead of 128. Not
# measured beyond 32 elements, where the fp32 row alone would take 64+ registers.
FP32_ROW_MAX = 32


def holds_fp32_row(config_: KernelConfig, problem: Problem) -> bool:
    """Whether a register row cache holds its 16-bit elements converted to fp32."""
    return (
        config_.cache == "registers" and problem.itemsize == 2
        and derive_shape(config_, problem).iters * config_.vec <= FP32_ROW_MAX
    )

# The bulk kernel holds a 16-bit tile as fp32 in registers up to this many elements per thread
# (then its weights are read from L1 for every row, as in the other kernels, and their register
# budget goes to the tile). Lab 17 (H200): x1.02-1.05 on every 16-element tile (t1024 at 8192
# and 16384); most 32-element tiles at 64 registers spilled 48-56 bytes, and with the grid sized
# for their registers (one 512-thread block per SM) they ran x0.91-1.01 (NOTES.md 25).
FP32_TILE_MAX = 16


def holds_fp32_tile(config_: KernelConfig, problem: Problem) -> bool:
    """Whether the bulk kernel converts its 16-bit tile to fp32 registers once per row."""
    return (
        config_.cache == "bulk" and problem.itemsize == 2
        and derive_shape(config_, problem).iters * config_.vec <= FP32_TILE_MAX
    )


def fuses_passes(config_: KernelConfig, problem: Problem) -> bool:
    """Whether a 16-bit two-pass kernel takes both of its sums in one pass.

    The kernel sums x - shift and its squares through one reduction and takes the centred sum of
    squares as s2 - s1 * mean. That cancels log2(s2 / M2) bits, so where it would cancel over 4
    (the shift, the row's first element, more than 3.9 spreads from the mean; the verifier's
    outlier rows) the kernel runs the second pass over its cached row after all. A 16-bit output
    keeps 8 or 11 bits, so the 4 lost fp32 bits never reach it; fp32 rows keep the corrected
    two-pass. The test must come out the same in every thread that reduces together: a row's
    threads see the same totals, but a cluster's barrier spans every row of its blocks, so
    clusters of multi-row blocks keep two passes.

    A/B on the H200, same configs, interleaved (NOTES.md 80): the shipped 16-bit winners at
    4096-16384 x1.002-1.018, other register and shared-memory configs x1.01-1.11. The bulk
    kernel keeps two passes: its deferred refill waits behind the first row sum's barrier, which
    fusing moves behind the heavier fused pass, and a 2-stage tile at bf16 32768 ran x0.89; fused
    with the refill behind a barrier of its own instead, its c1 winners at 16384-32768 ran
    x0.98-0.99 and its c4 winners at 65536 x1.00-1.01 (NOTES.md 81).
    """
    return (
        config_.cache != "bulk" and problem.itemsize == 2 and config_.stats == "two_pass"
        and (config_.cluster == 1 or config_.rows_per_block == 1)
    )

# The normalize pass of a 16-bit shared-memory row filled by cp.async is unrolled fully, not 4
# vectors deep, when a thread stores at most this many vectors of one row (two-pass statistics,
# one row per block, at most 256 threads, the 64-register cap): every weight/bias load of the
# row is then in flight in one round trip instead of two. Measured on the H200 (NOTES.md 48,
# lab/p3_lab.py): t256v8r1-smem-m64 at 16384 (8 vectors) x1.022 bf16 / x1.034 fp16, at 12288 (6)
# x1.009 / x1.000; at 4 vectors the code is the same. t512v8r1 at bf16 32768 (8 vectors) spilled
# 8 bytes under NVRTC, and nvcc 13.0 spilled 8-16 bytes in Welford kernels and several rows per
# block (sweep of the 980 kernels a looser rule touched), hence the bounds.
UNROLL_STORE_ITERS = 8


def unrolls_store(config_: KernelConfig, problem: Problem, device: DeviceLimits = H200) -> bool:
    """Whether the normalize-and-store pass is unrolled fully instead of 4 vectors deep."""
    return (
        fills_async(config_, problem, device) and problem.itemsize == 2
        and config_.stats == "two_pass" and config_.rows_per_block == 1
        and config_.max_regs > 0 and config_.threads <= 256
        and derive_shape(config_, problem).iters <= UNROLL_STORE_ITERS
    )
