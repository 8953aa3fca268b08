"""The launch plan: every fact a configuration derives on a problem and a device, computed once.

:func:`derive_plan` gathers the shape (:mod:`.shape`), the shared memory, the occupancy
(:mod:`.occupancy`) and the code paths the templates take (a prefetched next row, a cp.async
fill, a row or tile held as fp32, fused passes, an unrolled store, a deferred refill) into one
frozen :class:`Plan`. :func:`autonorm.ops.layer_norm.rules.check` judges a plan and
:func:`autonorm.ops.layer_norm.codegen.render` formats one into its template, so neither
derives a fact of its own. The functions after it (``fills_async``, ``smem_bytes``, ...) read
one fact of a plan, for tests and tools that ask for one.
"""

from __future__ import annotations

from dataclasses import dataclass

from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.occupancy import (
    bulk_blocks,
    capped_blocks,
    estimate_blocks,
    estimate_registers,
)
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.shape import Shape, derive_shape, launch_smem_bytes, stage_bytes
from autonorm.runtime.limits import H200, DeviceLimits

# A shared-memory row cache is filled by cp.async (LDGSTS, compute capability 8.0+) when a thread
# copies more than this many vectors per row: the plain fill stages them through registers four
# at a time (``#pragma unroll 4``), so longer rows wait for several round trips, while cp.async
# puts every copy in flight at once. x1.02-1.08 on 16-bit smem kernels of 6-8 vectors a thread,
# x1.047 at fp32 8192; at 4 vectors or fewer x0.986-1.009, so those keep the plain fill
# (docs/kernels.md).
ASYNC_FILL_ITERS = 4

# A 16-bit register row cache is held as fp32 (converted once, not once per pass) up to this
# many elements per thread: x1.03-1.14 on register-cached bf16/fp16 kernels at 1024-4096, and
# ptxas gave t128v8r4 at 1024 96 registers instead of 128. Beyond 32 elements the fp32 row alone
# would take 64+ registers (docs/kernels.md).
FP32_ROW_MAX = 32

# The bulk kernel holds a 16-bit tile as fp32 in registers up to this many elements per thread
# (then its weights are read from L1 for every row, as in the other kernels, and their register
# budget goes to the tile): x1.02-1.05 on every 16-element tile; 32-element tiles at 64
# registers spilled 48-56 bytes, and with the grid sized for their registers ran x0.91-1.01
# (docs/bulk-kernel.md).
FP32_TILE_MAX = 16

# The normalize pass of a 16-bit shared-memory row filled by cp.async is unrolled fully, not 4
# vectors deep, when a thread stores at most this many vectors of one row (two-pass statistics,
# one row per block, at most 256 threads, the 64-register cap): every weight/bias load of the
# row is then in flight in one round trip instead of two. t256v8r1-smem-m64 at 16384 (8
# vectors) ran x1.022 bf16 / x1.034 fp16; 512 threads and Welford or multi-row kernels spilled
# under a looser rule, hence the bounds (docs/kernels.md).
UNROLL_STORE_ITERS = 8

# Skewed rows keep weight and bias in the bulk kernel's registers up to this many vectors a
# thread, one fewer with the residual add: at 6 and 7, 17 of 429 skewed bulk kernels that held
# them spilled 4-92 bytes under nvcc 13.0 for sm_90 (bf16, fp16 and fp32 at 6001-20001, plain and
# residual), none at 5 or fewer; with the residual add, 4 of the default's 16-bit t128 picks at
# 5 vectors spilled 4-12 bytes (4801-5055).
SKEWED_WEIGHT_ITERS = 5

# A skewed bulk kernel whose weights are not held in registers keeps each thread's weight and
# bias vectors, shifted to its rows' offset, in shared memory ([it][thread]): joined once a
# launch instead of from two aligned vectors every row. It wins even where it costs a block an
# SM (H200, LayerNorm bf16 6151: 5 -> 4 blocks, 60% -> 82% of copy; docs/bulk-kernel.md). The
# norms (Problem.norm) that take it: RMSNorm shares the kernel but has not been timed with it.
# benchmarks/skew_weights.py and the tests set it to compare.
SKEWED_WEIGHTS_IN_SMEM: frozenset[str] = frozenset({"layer"})

# The row kernel with a register cache loads weight and bias beside x, before the statistics,
# where a thread holds this many vectors of a row or fewer. With a few rows a launch is one
# chain of dependent steps, and loads issued after the statistics add a round trip to it; the
# registers they hold meanwhile are few at this depth (docs/kernels.md, few rows).
EARLY_AFFINE_ITERS = 2

# A configuration asks for the early loads past EARLY_AFFINE_ITERS (``KernelConfig.early``) up to
# this many vectors a thread: 32 fp32 elements, where the sum of squares without compensation
# stays within 7.2e-8 of float64 on offset rows (H200, docs/kernels.md).
EARLY_AFFINE_MAX_ITERS = 8

# Elements at a row's start whose mean is the shift of fp32's fused statistics (fuses_passes):
# every thread of the row (and of its cluster) reads them itself, beside its own loads.
FUSED_SHIFT_ELEMENTS = 8


@dataclass(frozen=True)
class Plan:
    """What ``config`` derives on ``problem`` and a device: read by the rules and the templates.

    Attributes:
        config: the configuration planned.
        problem: the problem it runs.
        shape: the per-thread work (segment, threads per row, vectors a thread, evenness).
        smem_bytes: dynamic shared memory of a launch.
        stage_bytes: the bulk-copy kernel's stages within it (0 for the row kernel); with the
            residual add, x's stages and then the residual's.
        registers: the row kernel's estimated registers per thread.
        uncapped_blocks: blocks per SM the kernel is built for without a register cap (the
            row kernel: what the estimate allows; the bulk kernel: its occupancy).
        capped_blocks: blocks per SM that hold a thread to ``max_regs`` (0 when uncapped).
        min_blocks: the ``__launch_bounds__`` minimum blocks per SM.
        weights_in_registers: the bulk kernel holds weight and bias in registers.
        prefetch: the row kernel loads the next row while it finishes this one.
        async_fill: a shared-memory row is filled by cp.async, not through registers.
        fp32_row: a 16-bit register row is held converted to fp32.
        fp32_tile: the bulk kernel converts its 16-bit tile to fp32 registers once per row.
        fused_passes: a 16-bit two-pass kernel takes both of its sums in one pass.
        unrolled_store: the normalize-and-store pass is unrolled fully, not 4 vectors deep.
        deferred_refill: the bulk kernel refills the previous iteration's stage after its
            first row sum's barrier instead of behind a barrier of its own.
        early_affine: the row kernel loads weight and bias beside x, before the statistics.
        lean_fp32: an fp32 early-affine kernel (32 elements a thread at most) takes rsqrtf
            for the row's scale, and RMSNorm's squares sum without compensation.
        clamped_tail: an fp32 register row loads its last, partial iteration from indices
            clamped into the row, behind no branch (with weight and bias first when early).
    """

    config: KernelConfig
    problem: Problem
    shape: Shape
    smem_bytes: int
    stage_bytes: int
    registers: int
    uncapped_blocks: int
    capped_blocks: int
    min_blocks: int
    weights_in_registers: bool
    prefetch: bool
    async_fill: bool
    fp32_row: bool
    fp32_tile: bool
    fused_passes: bool
    unrolled_store: bool
    deferred_refill: bool
    weights_in_smem: bool = False
    weights_smem_offset: int = 0
    early_affine: bool = False
    lean_fp32: bool = False
    clamped_tail: bool = False

    @property
    def bulk(self) -> bool:
        """True for the bulk-copy kernel (``cache="bulk"``)."""
        return self.config.cache == "bulk"


def derive_plan(config: KernelConfig, problem: Problem, device: DeviceLimits = H200) -> Plan:
    """Derive every fact of ``config`` on ``problem`` and ``device`` (no validity checks).

    Valid for any configuration whose fields lie in their domains (:mod:`.config`); whether the
    plan can run is :func:`autonorm.ops.layer_norm.rules.check`'s to say.
    """
    shape = derive_shape(config, problem)
    bulk = config.cache == "bulk"
    smem = launch_smem_bytes(config, shape)
    stages = stage_bytes(config, shape) if bulk else 0
    if bulk and problem.residual:
        # The residual's tiles are staged beside x's (twice their bytes when float32 beside
        # 16-bit x).
        residual_stages = stages * problem.h_itemsize // problem.itemsize
        smem += residual_stages
        stages += residual_stages
    prefetch = prefetches(config)
    registers = estimate_registers(config, shape, 2 if prefetch else 1)
    capped = capped_blocks(config, device)
    sixteen_bit = problem.itemsize == 2
    elems = shape.iters * config.vec  # elements a thread holds of a row
    # A wide residual's h is float32 already, in its stage or row cache.
    fp32_tile = bulk and sixteen_bit and elems <= FP32_TILE_MAX and not problem.wide_residual
    wsmem = False
    wsmem_offset = 0
    if bulk:
        uncapped, wreg = bulk_blocks(config, problem, shape, smem, device)
        # A tile held as fp32 takes the registers the weights would have had.
        held = wreg and not fp32_tile and not (
            shape.skewed and shape.iters > SKEWED_WEIGHT_ITERS - int(problem.residual))
        affine = int(problem.has_weight) + int(problem.has_bias)
        joined_once = problem.norm in SKEWED_WEIGHTS_IN_SMEM
        if joined_once and shape.skewed and affine and not held:
            offset = -(-smem // 16) * 16
            with_weights = offset + affine * shape.iters * config.threads * config.vec * (
                problem.itemsize)
            if with_weights <= device.max_smem_optin:
                blocks, _ = bulk_blocks(config, problem, shape, with_weights, device)
                wsmem, wsmem_offset, smem, uncapped = True, offset, with_weights, blocks
        min_blocks = uncapped
    else:
        uncapped, held = estimate_blocks(registers, config, device), False
        min_blocks = max(uncapped, capped)
    async_fill = (
        config.cache == "smem" and device.cc >= 80
        # the residual add passes the row through registers on its way to shared memory
        and not problem.residual
        # cp.async copies 4, 8 or 16 bytes: not one 16-bit element
        and config.vec * problem.itemsize >= 4
        and shape.iters > ASYNC_FILL_ITERS
    )
    early = (
        (problem.has_weight or problem.has_bias) and early_affine_applies(config, problem, prefetch)
        and (shape.iters <= EARLY_AFFINE_ITERS or config.early)
    )
    return Plan(
        config=config,
        problem=problem,
        shape=shape,
        smem_bytes=smem,
        stage_bytes=stages,
        registers=registers,
        uncapped_blocks=uncapped,
        capped_blocks=capped,
        min_blocks=min_blocks,
        weights_in_registers=held,
        prefetch=prefetch,
        async_fill=async_fill,
        fp32_row=(config.cache == "registers" and sixteen_bit and elems <= FP32_ROW_MAX
                  and not problem.wide_residual),
        fp32_tile=fp32_tile,
        fused_passes=fuses_passes(
            config, problem,
            short=early and problem.itemsize == 4 and shape.iters <= EARLY_AFFINE_ITERS,
        ),
        unrolled_store=(
            async_fill and sixteen_bit and config.stats == "two_pass"
            and config.rows_per_block == 1 and config.max_regs > 0 and config.threads <= 256
            and shape.iters <= UNROLL_STORE_ITERS
            # a skewed row loads two vectors of weight and of bias a store: spilled at 64
            and not shape.skewed
        ),
        # A tile read from shared memory until the last pass, with a stage to spare, a block
        # barrier in its first row sum and no cluster: clustered kernels ran x0.91-1.00 with
        # the deferred refill (docs/bulk-kernel.md).
        deferred_refill=(
            bulk and not fp32_tile and config.stages >= 2 and shape.threads_per_row > 32
            and config.cluster == 1
        ),
        weights_in_smem=wsmem,
        weights_smem_offset=wsmem_offset,
        early_affine=early,
        # At one launch a chain, each step of it shows: on the H200 (CUDA-graph replay, fp32
        # defaults of RMSNorm and LayerNorm at 1 and 64 rows) rsqrtf took 1-5% off and the plain
        # sum of squares 1-4% more. At up to 32 terms a thread compensation has little to
        # correct (offset rows: 7.2e-8 of float64 at most, relative l2, against 6.0e-8 with it)
        # and rsqrtf's 2 ulp stay far under the 1e-6 bar. 16-bit kernels ran 7% faster to 10%
        # slower with rsqrtf.
        lean_fp32=early and problem.itemsize == 4,
        # A guarded load in a fully unrolled loop waits on the branch before it: the compiler
        # issued the partial iteration's loads one round trip after the others (SASS of the
        # fp32 register defaults, docs/kernels.md). Loading a clamped index instead ran fp32
        # LayerNorm and RMSNorm x1.05-1.21 as fast at 1-256 rows (H100); 16-bit kernels ran
        # x0.89-1.05 (RMSNorm bf16 at one row slower), so they keep the guard.
        clamped_tail=(
            config.cache == "registers" and not prefetch and problem.itemsize == 4
            and not (shape.even or shape.skewed or shape.ragged)
        ),
    )


def early_affine_applies(config: KernelConfig, problem: Problem, prefetch: bool) -> bool:
    """Whether the row kernel of ``config`` can load weight and bias beside x, if it has any.

    A register cache without a prefetched next row. Not under a register cap (chosen for the
    kernel without the held weights) nor with a float32 residual beside 16-bit x (twice the
    cache): neither was timed with them.
    """
    return (
        config.cache == "registers" and not prefetch and not problem.wide_residual
        and config.max_regs == 0
    )


def prefetches(config: KernelConfig) -> bool:
    """True when the row kernel loads the next row while it finishes this one.

    A persistent grid (blocks_per_sm > 0) with a register cache holds two rows per thread: the
    one being normalized and the next one, whose loads are in flight meanwhile.
    """
    return config.cache == "registers" and config.blocks_per_sm > 0


def fuses_passes(config: KernelConfig, problem: Problem, short: bool = False) -> bool:
    """Whether a two-pass LayerNorm kernel takes both of its sums in one pass.

    The kernel sums x - shift and its squares through one reduction and takes the centred sum of
    squares as s2 - s1 * mean. That cancels log2(s2 / M2) bits, so where it would cancel too
    many the kernel runs the second pass over its cached row after all. The test must come out
    the same in every thread that reduces together: a row's threads see the same totals, but a
    cluster's barrier spans every row of its blocks, so clusters of multi-row blocks keep two
    passes.

    16-bit rows: the shift is the row's first element and the second pass runs past 4 bits
    (the shift more than 3.9 spreads from the mean; the verifier's outlier rows). A 16-bit
    output keeps 8 or 11 bits, so the 4 lost fp32 bits never reach it. The shipped 16-bit
    winners at 4096-16384 ran x1.002-1.018 fused, other register and shared-memory
    configurations x1.01-1.11. The bulk kernel keeps two passes: its deferred refill waits
    behind the first row sum's barrier, which fusing moves behind the heavier fused pass (a
    2-stage tile at bf16 32768 ran x0.89), and with the refill behind a barrier of its own its
    winners ran x0.98-1.01 (docs/accuracy.md, docs/bulk-kernel.md).

    fp32 rows of the few-row kernels (``short``: ``plan.lean_fp32`` at two vectors a thread or
    fewer, no residual add; with more, the fused kernels took 8 more registers and one of 32
    elements a thread spilled): a launch there is one chain of steps, and a second reduction is
    one more link (bf16 490 at
    one row, one reduction, ran 0.15 us under fp32's two in the same configuration; H100,
    docs/kernels.md). The shift is the mean of the row's first FUSED_SHIFT_ELEMENTS elements,
    whose distance from the row's mean on normal data is a spread over sqrt(8), and the second
    pass (the corrected two-pass) runs past 2 bits (the shift over 1.7 spreads from the mean),
    which such a shift leaves to about one row in a million. Every output then holds the
    fp32 bar (1e-6 of float64 on offset rows). Other fp32 kernels keep the corrected two-pass.
    """
    if problem.norm != "layer" or config.cache == "bulk" or config.stats != "two_pass":
        return False
    if config.cluster > 1 and config.rows_per_block > 1:
        return False
    if problem.itemsize == 2:
        return True
    return short and config.cache == "registers" and not problem.residual


# The facts below are read from a plan: each is derived once, in derive_plan.


def smem_bytes(config: KernelConfig, problem: Problem) -> int:
    """Dynamic shared memory a launch of ``config`` needs, in bytes."""
    return derive_plan(config, problem).smem_bytes


def bulk_stage_bytes(config: KernelConfig, problem: Problem) -> int:
    """Shared memory of the bulk-copy kernel's stages: stages x rows per tile x segment bytes."""
    return derive_plan(config, problem).stage_bytes


def register_estimate(config: KernelConfig, problem: Problem) -> int:
    """Registers per thread the row kernel needs, estimated (an upper bound in practice)."""
    return derive_plan(config, problem).registers


def min_blocks_per_sm(config: KernelConfig, problem: Problem, device: DeviceLimits = H200) -> int:
    """The ``__launch_bounds__`` minimum blocks per SM (the register estimate's, or the cap's)."""
    return derive_plan(config, problem, device).min_blocks


def bulk_occupancy(
    config: KernelConfig, problem: Problem, device: DeviceLimits = H200
) -> tuple[int, bool]:
    """Blocks per SM the bulk-copy kernel is built for, and whether it holds weights in registers.

    Shared memory (the stages) and threads decide how many blocks fit an SM, and the kernel's
    register need may allow fewer; the ``__launch_bounds__`` minimum is the count reached.
    Weight and bias stay in registers when that costs no block of it and the tile is not held
    as fp32 (:func:`holds_fp32_tile`).
    """
    plan = derive_plan(config, problem, device)
    return plan.min_blocks, plan.weights_in_registers


def fills_async(config: KernelConfig, problem: Problem, device: DeviceLimits = H200) -> bool:
    """Whether a shared-memory row cache is filled by cp.async instead of through registers."""
    return derive_plan(config, problem, device).async_fill


def holds_fp32_row(config: KernelConfig, problem: Problem) -> bool:
    """Whether a register row cache holds its 16-bit elements converted to fp32."""
    return derive_plan(config, problem).fp32_row


def holds_fp32_tile(config: KernelConfig, problem: Problem) -> bool:
    """Whether the bulk kernel converts its 16-bit tile to fp32 registers once per row."""
    return derive_plan(config, problem).fp32_tile


def unrolls_store(config: KernelConfig, problem: Problem, device: DeviceLimits = H200) -> bool:
    """Whether the normalize-and-store pass is unrolled fully instead of 4 vectors deep."""
    return derive_plan(config, problem, device).unrolled_store
