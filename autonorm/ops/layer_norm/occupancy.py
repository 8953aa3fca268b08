"""Registers and blocks per SM: the occupancy each kernel is built for.

The row kernel's register estimate and the ``__launch_bounds__`` minimum it gives, the blocks
that hold a thread to a register cap, and the bulk-copy kernel's occupancy with its choice of
holding weight and bias in registers. Every margin here was fitted to ptxas reports of rendered
kernels (nvcc 13.0, sm_90); the sweeps and the speed figures are in docs/registers.md.
"""

from __future__ import annotations

from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.shape import Shape
from autonorm.runtime.limits import H200, DeviceLimits

# Registers the row kernel needs besides its row cache.
OTHER_REGS = 40

# The bulk-copy kernel's registers besides weights held in registers, and the most weight/bias
# vectors it holds per thread: with weights of 8 vectors in registers and a cluster of 2 a
# 512-thread kernel fits 128 registers without spills; without weights 64 registers suffice.
BULK_OTHER_REGS = 40

BULK_MAX_WEIGHT_ITERS = 8


def estimate_registers(config: KernelConfig, shape: Shape, rows_held: int = 1) -> int:
    """Registers per thread the row kernel needs, estimated (an upper bound in practice).

    The rest of the kernel needs about OTHER_REGS; a register row cache adds its elements as
    fp32 values (the compiler converts early), ``rows_held`` rows of them when the next row is
    loaded ahead; Welford's running triplets and divides about half as much again, and a
    cluster's extra reductions 16. Every register-cache kernel it admits compiles without
    spills (docs/registers.md).
    """
    need = OTHER_REGS + (16 if config.cluster > 1 else 0)
    per_elem = 1.5 if config.stats == "welford" else 1.25
    if config.cache == "registers":
        elems = shape.iters * config.vec * rows_held
    else:
        elems = 4 * config.vec  # the loops are unrolled 4 vectors deep
    return need + int(elems * per_elem)


def estimate_blocks(registers: int, config: KernelConfig, device: DeviceLimits) -> int:
    """Blocks per SM that ``registers`` (the estimate) allows the row kernel.

    Without a ``__launch_bounds__`` minimum ptxas guesses: at 512 threads it capped a kernel at
    32 registers and spilled 4 KB; with a minimum of 1 it gave a 128-thread kernel 128
    registers, so only 4 blocks fit an SM and it ran at 75% instead of ~85% of copy bandwidth
    (bf16 4096; docs/registers.md).
    """
    # 32 registers of margin: with 0 or 16 ptxas still spilled some.
    need = -(-registers // 8) * 8 + 32
    # Registers are allocated per warp-scheduler quarter of the SM (regs_per_sm / 4 each), so
    # count warps per quarter: with one-warp blocks the whole-SM division promised ~100
    # registers where ptxas could give 96, and spilled.
    warps = max(1, config.threads // 32)
    warps_per_quarter = (device.regs_per_sm // 4) // (32 * need)
    return _resident((4 * warps_per_quarter) // warps, config, device)


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


def bulk_blocks(
    config: KernelConfig, problem: Problem, shape: Shape, smem: int, device: DeviceLimits
) -> tuple[int, bool]:
    """Blocks per SM the bulk-copy kernel is built for, and whether weight and bias fit registers.

    Shared memory (``smem`` a block) and threads decide how many blocks fit an SM, and the
    kernel's register need may allow fewer; the ``__launch_bounds__`` minimum is the count
    reached. Weight and bias stay in registers (4 per 16-byte vector each) when that costs no
    block of it.
    """
    by_smem = device.smem_per_sm // (smem + 1024)  # the driver reserves 1 KB per block
    by_threads = device.max_threads_per_sm // config.threads
    target = max(1, min(by_smem, by_threads, 32))
    iters = shape.iters
    # Unrolled loops keep about a vector's four registers per vector in flight; ragged tails
    # keep masks and indices live.
    base = BULK_OTHER_REGS + 4 * iters + (8 if config.cluster > 1 else 0)
    if not shape.even:
        base += 8
    affine = int(problem.has_weight) + int(problem.has_bias)
    # With weights in registers ptxas unrolls less: 512 threads, 8 vectors of weight and bias
    # and a cluster of 2 fit 128 registers without spills, so the weights replace the in-flight
    # term rather than add to it.
    with_weights = base - 4 * iters + 4 * iters * affine
    if config.rows_per_block > 1:  # 2048, 4-16 rows of a warp, 8 vectors: 16-104 B spilled
        with_weights += 32
    if problem.residual:  # 16-bit 16384, t512, 4 vectors, at the 64-register cap: 8-16 B spilled
        with_weights += 8
        if problem.weight_offset:
            # (1 + w) beside the residual: 16-bit 65536, t512 c2 and t256 c4 with one stage,
            # 8 vectors, spilled 4-12 B at 128 registers with the weights held.
            with_weights += 40
    if problem.wide_residual:
        # A float32 vector of the stage is two 16-byte loads: bf16 65536, t128 c8, 8 vectors
        # with weights in registers spilled 96 B at 128 registers.
        base += 4 * iters
        with_weights += 4 * iters

    def fits(need: int, blocks: int) -> bool:
        # 8 registers of margin, allocation in units of 8, and registers split per scheduler
        # quarter of the SM (as in estimate_blocks): at the bare estimate 32-72-register caps
        # spilled 4-28 bytes.
        need = -(-(need + 8) // 8) * 8
        warps = max(1, config.threads // 32)
        per_quarter = -(-(warps * blocks) // 4)
        return need <= 255 and per_quarter * 32 * need <= device.regs_per_sm // 4

    # The blocks the kernel's own registers allow, then weights in registers if they fit there.
    # Deciding the weights at the target instead (shared memory's count, which the registers may
    # not reach) ran t256 c2 s2 at bf16 32768 with 2 blocks and its weights read from L1 every
    # row: x0.984 of the same kernel with them in registers; t256 c4 s2 at bf16 65536 x0.956.
    blocks = target
    while blocks > 1 and not fits(base, blocks):
        blocks -= 1
    wreg = affine > 0 and iters <= BULK_MAX_WEIGHT_ITERS and fits(with_weights, blocks)
    return blocks, wreg
