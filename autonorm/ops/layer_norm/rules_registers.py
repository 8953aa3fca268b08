"""The register rules of the row kernel: row-cache limits, the spills ptxas reports, the cap.

A kernel that spills is usually slower; these rules keep the search from spending trials on kernels
that would (one that spills all the same is timed like any other). Each limit was fitted to ptxas
reports of rendered kernels (nvcc 13.0, sm_90) and matches exactly the kernels that spilled in its
sweep (docs/registers.md).
:func:`autonorm.ops.layer_norm.rules.check` calls :func:`register_reasons` and, for a capped
configuration that passes every other rule, :func:`max_regs_reasons`.
"""

from __future__ import annotations

from autonorm.ops.layer_norm.plan import Plan
from autonorm.runtime.limits import DeviceLimits

# The largest register row cache a 64-register cap holds without spilling: in a ptxas sweep of
# 5,353 capped bf16 kernels all 300 cluster-1 register caches of up to 24 elements in up to 8
# vectors per thread fitted (prefetching ones included); of 32 or more elements 19 of 36
# spilled, and all 62 that prefetch the next row; of up to 24 in more than 8 vectors, 1 of 8.
MAX_REGS_CACHE_ELEMS = 24

MAX_REGS_CACHE_ITERS = 8

# Registers a thread may spend on the row cache. Beyond this ptxas spills or occupancy
# collapses; the rest of the kernel needs about 40 registers. The compiler may hold the cached
# row converted to fp32, so elements per thread are capped too: at 128 elements (bf16, 32
# vectors of 4) ptxas used 255 registers and spilled.
MAX_CACHE_ITERS = 16

MAX_CACHE_ELEMS = 64


def register_reasons(plan: Plan, device: DeviceLimits) -> list[str]:
    """Return why the row kernel of ``plan`` would run out of registers on ``device``."""
    config, problem, shape = plan.config, plan.problem, plan.shape
    reasons = []
    reg_cap = min(255, device.regs_per_sm // config.threads)
    if config.cache == "registers":
        elems = shape.iters * config.vec
        # A cluster's extra reductions keep more live: two fp32 two-pass kernels with cluster 2
        # spilled at iters 8 (1024 threads) and 16 (512 threads).
        max_iters = MAX_CACHE_ITERS if config.cluster == 1 else MAX_CACHE_ITERS // 2
        if plan.prefetch:  # two rows live: 16 fp32 vectors of 2 spilled
            max_iters = min(max_iters, MAX_CACHE_ITERS // 2)
        # Sub-warp rows keep per-row masks and indices live: 48 fp32 elements spilled at 128
        # registers (768, 16 threads per row).
        max_elems = MAX_CACHE_ELEMS if shape.threads_per_row >= 32 else MAX_CACHE_ELEMS // 2
        if problem.itemsize == 4:  # 64 fp32 elements spilled at 168 registers
            max_elems = min(max_elems, MAX_CACHE_ELEMS // 2)
        if shape.iters > max_iters or elems > max_elems:
            reasons.append(
                f"register row cache of {shape.iters} vectors / {elems} elements per thread "
                f"(limits {max_iters} / {max_elems})"
            )
        elif plan.registers + 16 > reg_cap:  # 16 of margin: at the bare estimate one spilled
            reasons.append(
                f"register row cache needs about {plan.registers} registers per thread; "
                f"{config.threads} threads allow {reg_cap}"
            )
    if config.threads == 1024 and config.stats == "welford" and config.cluster > 1:
        # At 64 registers per thread the cluster merge of Welford triplets spills.
        reasons.append("welford across a cluster spills at 1024 threads (64 registers each)")
    if spills_at_1024_fp32(plan):
        reasons.append(
            f"{config.threads}-thread fp32 kernels without a register cache spill at 64 registers "
            f"per thread with {shape.iters} vectors per thread here (nvcc 13.0)"
        )
    if shape.skewed and config.cache == "registers" and shape.iters > SKEWED_CACHE_ITERS:
        # The shifted weights' registers come on top of the row's: an fp16 25644 cache of 7
        # vectors a thread spilled 56 bytes at 128 registers (nvcc 13.0).
        reasons.append(f"a skewed register row cache of {shape.iters} vectors a thread spills "
                       f"(at most {SKEWED_CACHE_ITERS})")
    if shape.skewed and config.threads == 1024:
        # 64 registers a thread: a bf16 62012 shared-memory row spilled 8 bytes (nvcc 13.0).
        reasons.append("1024-thread kernels spill on skewed rows (64 registers a thread)")
    if spills_fp32_register_cache(plan):
        reasons.append(
            f"an fp32 register row cache of {shape.iters} vectors per thread spills with "
            f"{'Welford statistics' if config.stats == 'welford' else 'one-warp blocks'} "
            "(nvcc 13.0)"
        )
    return reasons


# Vectors a thread a skewed register row cache may hold (see register_reasons).
SKEWED_CACHE_ITERS = 4


def spills_at_1024_fp32(plan: Plan) -> bool:
    """True for the fp32 1024-thread kernels without a register cache that ptxas spills.

    At 64 registers per thread, nvcc 13.0 (sm_90) spills 8-32 bytes where an unroll-by-4 loop
    leaves two vectors over: uncached Welford at 2-4 rows a block with 6, 10 or 14 vectors per
    thread (and at one row with exactly 4, hidden 16384), and shared-memory rows of 32 a block
    with 6 or 10. Exact on 1,692 fp32 1024-thread kernels over 28 hidden sizes (22 spilled, all
    matched, none other).
    """
    config, shape = plan.config, plan.shape
    if not (plan.problem.itemsize == 4 and config.threads == 1024 and config.vec == 4
            and config.cluster == 1):
        return False
    two_over = shape.iters >= 6 and shape.iters % 4 == 2
    if config.cache == "none" and config.stats == "welford":
        if config.rows_per_block == 1:
            return shape.iters == 4 and shape.even
        return config.rows_per_block <= 4 and two_over
    return config.cache == "smem" and config.rows_per_block >= 32 and two_over


def spills_fp32_register_cache(plan: Plan) -> bool:
    """True for the fp32 register row caches of 16 vectors a thread that ptxas spills.

    At 16 vectors (32 elements at vec 2, 16 at vec 1) ptxas spills 16-92 bytes at its 96-128
    register ceiling: Welford's at 1000-8192 (25 of 58 kernels, keep_x's policy register
    among them) and the one-warp two-pass kernel at 1024. The register estimate admits them.
    A sweep of all 232 fp32 register caches of 10+ vectors at vec 1-2 over 11 hidden sizes
    spilled these and no other. The two-pass fp32 4096 winner, t256v2r2, is one of the
    16-vector caches that does not spill.
    """
    config = plan.config
    if not (plan.problem.itemsize == 4 and config.cache == "registers" and config.cluster == 1
            and plan.shape.iters >= 16):
        return False
    return config.stats == "welford" or config.threads == 32


def max_regs_reasons(plan: Plan) -> list[str]:
    """Why a register cap cannot apply to the row kernel of ``plan``."""
    config, problem, shape = plan.config, plan.problem, plan.shape
    reasons = []
    held = 2 if plan.prefetch else 1
    if problem.itemsize == 4:
        # fp32 holds twice the registers per byte: 13 of 540 capped cluster-1 fp32 kernels
        # spilled, shared-memory and uncached ones among them, where 0 of 1,080 16-bit ones did
        # (an out-of-sample ptxas sweep). The gain was measured in 16-bit only.
        return [f"max_regs {config.max_regs} applies to 16-bit rows only (fp32 kernels spill "
                "under the cap)"]
    if shape.skewed:
        # The skewed row's shifted weights and partial vectors take registers of their own:
        # under the cap ptxas spilled 24-40 bytes in fp16 register caches of 3 vectors a thread
        # and 8 in a bf16 shared-memory row (nvcc 13.0, sm_90).
        return [f"max_regs {config.max_regs} does not apply to skewed rows (vec {config.vec} "
                f"does not divide hidden {problem.hidden}): they spill under the cap"]
    if config.cluster > 1:
        # A cluster's extra reductions and exchange spill under the cap: clustered register
        # caches in 111 of 567, uncached kernels in 10 of 399. Clustered smem kernels did not
        # (0 of 838), but the clustered winners are bulk kernels, which take no cap, so one
        # simple rule.
        reasons.append(f"max_regs {config.max_regs} applies to cluster 1 only: a cluster's "
                       "exchange spills under the cap")
    elif config.cache == "registers" and (
        held * shape.iters * config.vec > MAX_REGS_CACHE_ELEMS
        or held * shape.iters > MAX_REGS_CACHE_ITERS
    ):
        # A prefetching cache holds the next row too: fp16 768's t128v8r4-p1-m64 (24 elements,
        # 48 held) spilled 8 bytes at the cap.
        reasons.append(
            f"max_regs {config.max_regs}: a register row cache of {held * shape.iters} vectors "
            f"/ {held * shape.iters * config.vec} elements per thread"
            f"{' (this row and the next)' if held == 2 else ''} spills under the cap (limits "
            f"{MAX_REGS_CACHE_ITERS} / {MAX_REGS_CACHE_ELEMS})"
        )
    if reasons:
        return reasons
    if plan.uncapped_blocks >= plan.capped_blocks:
        # The same kernel as max_regs=0: the search would measure it twice.
        return [f"max_regs {config.max_regs} changes nothing: the register estimate already "
                f"asks for {plan.uncapped_blocks} blocks of {config.threads} threads per SM"]
    return []
