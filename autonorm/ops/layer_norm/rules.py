"""The search space: problems, kernel configurations, validity rules and enumeration.

A :class:`Problem` is what the user asks for (hidden size, dtype, affine flags). A
:class:`KernelConfig` is one point of the template family. :func:`check` says why a
configuration cannot run a problem on a device, before anything is compiled;
:func:`enumerate_space` lists every valid configuration and :func:`default_config` picks a sound
one for any hidden size without tuning.

Pure logic: no CuPy, no GPU.
"""

from __future__ import annotations

import dataclasses
import math

from autonorm.errors import ConfigError
from autonorm.ops.layer_norm.config import (
    BLOCKS_PER_SM,
    CACHES,
    CLUSTERS,
    MAX_REGS,
    ROWS_PER_BLOCK,
    STAGES,
    STATS,
    THREADS,
    VECS,
    KernelConfig,
)
from autonorm.ops.layer_norm.plan import (
    Shape,
    capped_blocks,
    derive_shape,
    fills_async,
    min_blocks_per_sm,
    prefetches,
    register_estimate,
    smem_bytes,
)
from autonorm.ops.layer_norm.problem import Problem
from autonorm.runtime.limits import H200, DeviceLimits

# The largest register row cache a 64-register cap holds without spilling: in the ptxas sweep
# of 5,353 capped bf16 kernels (nvcc 13.0, sm_90, 2026-11-30; NOTES.md 33) all 300 cluster-1
# register caches of up to 24 elements in up to 8 vectors per thread fitted (prefetching ones
# included); of 32 or more elements 19 of 36 spilled, and all 62 that prefetch the next row; of
# up to 24 in more than 8 vectors, 1 of 8.
MAX_REGS_CACHE_ELEMS = 24

MAX_REGS_CACHE_ITERS = 8

# Registers a thread may spend on the row cache. Beyond this ptxas spills or occupancy collapses;
# the rest of the kernel needs about 40 registers (ptxas -v on sm_90, 2026-11-29). The compiler may
# hold the cached row converted to fp32, so elements per thread are capped too: at 128 elements
# (bf16, 32 vectors of 4) ptxas used 255 registers and spilled (nvcc 13.0 sweep, 2026-11-29).
MAX_CACHE_ITERS = 16

MAX_CACHE_ELEMS = 64

# Longest Welford run one thread may make. Its M2 grows by many small updates, each rounded
# relative to the running total, so the error grows with the run: on the verifier's
# outlier-first case (fp32, two elements 3000 spreads above a mean-1000 row, one thread per row)
# the H200 measured 5.0e-6 at 6,500 elements (tolerance 2e-6; GPU fuzz test, 2026-11-30) and
# benchmarks/lab/welford_emulation.py reproduces it exactly and gives 7.7e-6 at 8192, 1.4e-6 at
# 4096, 4.8e-7 at 2048. 16-bit rows keep the older cap of 8192 (set when 65,536 elements per
# thread measured 6e-6, NOTES.md 6): their tolerances are 1e-3 / 8e-3.
WELFORD_RUN_MAX = 2048

WELFORD_RUN_MAX_16BIT = 8192

BULK_MAX_ITERS = 8


def welford_run_cap(problem: Problem) -> int:
    """The most elements one thread may run Welford over for this problem's dtype."""
    return WELFORD_RUN_MAX if problem.itemsize == 4 else WELFORD_RUN_MAX_16BIT


def check(
    config: KernelConfig,
    problem: Problem,
    device: DeviceLimits = H200,
    *,
    allow_unstable: bool = False,
) -> list[str]:
    """Return the reasons ``config`` cannot run ``problem`` on ``device`` (empty if valid).

    Args:
        config: the candidate configuration.
        problem: the problem it should solve.
        device: the device limits to respect.
        allow_unstable: accept ``stats="naive"`` (only the verifier's self-test does).

    """
    reasons: list[str] = []
    if config.threads not in THREADS:
        reasons.append(f"threads must be one of {THREADS}")
    if config.vec not in VECS:
        reasons.append(f"vec must be one of {VECS}")
    elif config.vec * problem.itemsize > 16:
        reasons.append(f"vec {config.vec} x {problem.itemsize} bytes exceeds a 16-byte access")
    elif problem.hidden % config.vec:
        reasons.append(
            f"vec {config.vec} does not divide hidden {problem.hidden}: rows would start "
            "misaligned for vector access"
        )
    if config.rows_per_block not in ROWS_PER_BLOCK:
        reasons.append(f"rows_per_block must be one of {ROWS_PER_BLOCK}")
    elif config.threads % config.rows_per_block or config.threads < config.rows_per_block:
        reasons.append("rows_per_block must divide threads")
    if config.cache not in CACHES:
        reasons.append(f"cache must be one of {CACHES}")
    stats_ok = STATS + (("naive",) if allow_unstable else ())
    if config.stats not in stats_ok:
        reasons.append(f"stats must be one of {stats_ok}")
    if config.cluster not in CLUSTERS:
        reasons.append(f"cluster must be one of {CLUSTERS}")
    if config.blocks_per_sm not in BLOCKS_PER_SM:
        reasons.append(f"blocks_per_sm must be one of {BLOCKS_PER_SM}")
    if config.stages not in STAGES:
        reasons.append(f"stages must be one of {STAGES}")
    if config.max_regs not in MAX_REGS:
        reasons.append(f"max_regs must be one of {MAX_REGS}")
    if reasons:
        return reasons
    if config.cache == "bulk":
        reasons.extend(_bulk_reasons(config, problem, device))
    else:
        if config.stages:
            reasons.append("stages apply to the bulk-copy kernel only (cache='bulk'); use 0")
        if config.keep_x and config.cluster > 1:
            # Three clustered smem kernels with keep_x (16-byte cp.async fills with the hint)
            # raised cudaErrorIllegalInstruction on the H200, their plain twins verified
            # (benchmarks/NOTES.md 122). Clustered rows win only in the bulk kernel.
            reasons.append("keep_x applies to the fwd kernel at cluster 1 only (clustered "
                           "kernels with the hint raised an illegal instruction)")
        elif config.keep_x and problem.itemsize == 4 and fills_async(config, problem, device):
            # Every fp32 one-row two-pass smem kernel filled by hinted cp.async that was run
            # (4-, 8- and 16-byte fills, 8-64 vectors a thread, a persistent grid too) raised
            # cudaErrorIllegalInstruction on the H200; their plain twins verified (call s26e,
            # NOTES.md 126). The Welford and two-row forms verified, but the cause is not
            # known, so every fp32 kernel with a hinted cp.async fill is refused. No fp32
            # winner fills by cp.async; every 16-bit hinted fill run verified (calls s25e-s26e).
            reasons.append("keep_x is refused to fp32 kernels whose shared-memory row is "
                           "filled by cp.async (the hinted fill raised an illegal instruction)")
    if reasons:
        return reasons

    if config.cluster > 1:
        if device.cc < 90:
            reasons.append("thread-block clusters need compute capability 9.0 or newer")
        if config.rows_per_block != 1:
            reasons.append("a cluster splits one row: rows_per_block must be 1")
        if problem.hidden % (config.cluster * config.vec):
            reasons.append("cluster x vec must divide hidden so every block gets whole vectors")
    if config.stats == "two_pass" and config.cache == "none":
        reasons.append("two_pass statistics re-read the row: they need a row cache")

    shape = derive_shape(config, problem)
    if config.cache != "bulk" and shape.threads_per_row > 32 and config.rows_per_block > 15:
        # Rows of several warps synchronise with named barriers 1..rows_per_block; a block has
        # 16 (0..15), so 16 such rows would use barrier 16, which does not exist.
        reasons.append("more than 15 multi-warp rows per block exceed the 16 named barriers")
    run_cap = welford_run_cap(problem)
    if config.stats == "welford" and shape.iters * config.vec > run_cap:
        reasons.append(
            f"welford over more than {run_cap} elements per thread loses fp32 accuracy"
        )
    vectors = math.ceil(shape.segment / config.vec)
    if vectors * 2 <= shape.threads_per_row:
        reasons.append(
            f"{shape.threads_per_row} threads per row for {vectors} vectors: over half the "
            "threads would idle"
        )
    reg_cap = min(255, device.regs_per_sm // config.threads)
    if config.cache == "registers":
        elems = shape.iters * config.vec
        need_regs = register_estimate(config, problem)
        # A cluster's extra reductions keep more live: two fp32 two-pass kernels with cluster 2
        # spilled at iters 8 (1024 threads) and 16 (512 threads) in the same sweep.
        max_iters = MAX_CACHE_ITERS if config.cluster == 1 else MAX_CACHE_ITERS // 2
        if prefetches(config):  # two rows live: 16 fp32 vectors of 2 spilled (sweep of 252)
            max_iters = min(max_iters, MAX_CACHE_ITERS // 2)
        # Sub-warp rows keep per-row masks and indices live: 48 fp32 elements spilled at 128
        # registers (768, 16 threads per row, same sweep).
        max_elems = MAX_CACHE_ELEMS if shape.threads_per_row >= 32 else MAX_CACHE_ELEMS // 2
        if problem.itemsize == 4:  # 64 fp32 elements spilled at 168 registers (756-kernel sweep)
            max_elems = min(max_elems, MAX_CACHE_ELEMS // 2)
        if shape.iters > max_iters or elems > max_elems:
            reasons.append(
                f"register row cache of {shape.iters} vectors / {elems} elements per thread "
                f"(limits {max_iters} / {max_elems})"
            )
        elif need_regs + 16 > reg_cap:  # 16 of margin: at the bare estimate one kernel spilled
            reasons.append(
                f"register row cache needs about {need_regs} registers per thread; "
                f"{config.threads} threads allow {reg_cap}"
            )
    if config.threads == 1024 and config.stats == "welford" and config.cluster > 1:
        # At 64 registers per thread the cluster merge of Welford triplets spills (same sweep).
        reasons.append("welford across a cluster spills at 1024 threads (64 registers each)")
    if _spills_at_1024_fp32(config, problem, shape):
        reasons.append(
            f"{config.threads}-thread fp32 kernels without a register cache spill at 64 registers "
            f"per thread with {shape.iters} vectors per thread here (nvcc 13.0)"
        )
    if _spills_fp32_register_cache(config, problem, shape):
        reasons.append(
            f"an fp32 register row cache of {shape.iters} vectors per thread spills with "
            f"{'Welford statistics' if config.stats == 'welford' else 'one-warp blocks'} "
            "(nvcc 13.0)"
        )
    need = smem_bytes(config, problem)
    if need > device.max_smem_optin:
        reasons.append(
            f"needs {need} bytes of shared memory (device opt-in limit {device.max_smem_optin})"
        )
    if config.max_regs and not reasons:
        reasons.extend(_max_regs_reasons(config, problem, shape, device))
    return reasons


def _spills_at_1024_fp32(config: KernelConfig, problem: Problem, shape: Shape) -> bool:
    """True for the fp32 1024-thread kernels without a register cache that ptxas spills.

    At 64 registers per thread, nvcc 13.0 (sm_90) spills 8-32 bytes where an unroll-by-4 loop
    leaves two vectors over: uncached Welford at 2-4 rows a block with 6, 10 or 14 vectors per
    thread (and at one row with exactly 4, hidden 16384), and shared-memory rows of 32 a block
    with 6 or 10. Exact on 1,692 fp32 1024-thread kernels over 28 hidden sizes (22 spilled, all
    matched, none other), 2026-11-30; the evaluator rejects any spilled kernel at run time, so
    this only keeps the search from wasting trials on them.
    """
    if not (problem.itemsize == 4 and config.threads == 1024 and config.vec == 4
            and config.cluster == 1):
        return False
    two_over = shape.iters >= 6 and shape.iters % 4 == 2
    if config.cache == "none" and config.stats == "welford":
        if config.rows_per_block == 1:
            return shape.iters == 4 and shape.even
        return config.rows_per_block <= 4 and two_over
    return config.cache == "smem" and config.rows_per_block >= 32 and two_over


def _spills_fp32_register_cache(config: KernelConfig, problem: Problem, shape: Shape) -> bool:
    """True for the fp32 register row caches of 16 vectors a thread that ptxas spills.

    At 16 vectors (32 elements at vec 2, 16 at vec 1) ptxas spills 16-92 bytes at its 96-128
    register ceiling: Welford's at 1000-8192 (25 of 58 kernels, keep_x's policy register
    among them) and the one-warp two-pass kernel at 1024. The register estimate admits them.
    Found when keep_x doubled the offline sweep's variants; a sweep of all 232 fp32 register
    caches of 10+ vectors at vec 1-2 over 11 hidden sizes spilled these and no other
    (benchmarks/NOTES.md 122, 2026-11-30). The two-pass fp32 4096 winner, t256v2r2, is one
    of the 16-vector caches that does not spill.
    """
    if not (problem.itemsize == 4 and config.cache == "registers" and config.cluster == 1
            and shape.iters >= 16):
        return False
    return config.stats == "welford" or config.threads == 32


def _max_regs_reasons(
    config: KernelConfig, problem: Problem, shape: Shape, device: DeviceLimits
) -> list[str]:
    """Why a register cap cannot apply to ``config`` (not a bulk config; ``shape`` is its own)."""
    reasons = []
    held = 2 if prefetches(config) else 1
    if problem.itemsize == 4:
        # fp32 holds twice the registers per byte: 13 of 540 capped cluster-1 fp32 kernels
        # spilled, shared-memory and uncached ones among them, where 0 of 1,080 16-bit ones did
        # (out-of-sample ptxas sweep, nvcc 13.0, 2026-11-30; NOTES.md 34). The gain was measured
        # in 16-bit only.
        return [f"max_regs {config.max_regs} applies to 16-bit rows only (fp32 kernels spill "
                "under the cap)"]
    if config.cluster > 1:
        # A cluster's extra reductions and exchange spill under the cap: clustered register
        # caches in 111 of 567, uncached kernels in 10 of 399 (ptxas sweep, NOTES.md 33).
        # Clustered smem kernels did not (0 of 838), but the clustered winners are bulk kernels,
        # which take no cap, so one simple rule.
        reasons.append(f"max_regs {config.max_regs} applies to cluster 1 only: a cluster's "
                       "exchange spills under the cap")
    elif config.cache == "registers" and (
        held * shape.iters * config.vec > MAX_REGS_CACHE_ELEMS
        or held * shape.iters > MAX_REGS_CACHE_ITERS
    ):
        # A prefetching cache holds the next row too: fp16 768's t128v8r4-p1-m64 (24 elements,
        # 48 held) spilled 8 bytes at the cap (nvcc 13.0, NOTES.md 122).
        reasons.append(
            f"max_regs {config.max_regs}: a register row cache of {held * shape.iters} vectors "
            f"/ {held * shape.iters * config.vec} elements per thread"
            f"{' (this row and the next)' if held == 2 else ''} spills under the cap (limits "
            f"{MAX_REGS_CACHE_ITERS} / {MAX_REGS_CACHE_ELEMS})"
        )
    if reasons:
        return reasons
    uncapped = min_blocks_per_sm(dataclasses.replace(config, max_regs=0), problem, device)
    if uncapped >= capped_blocks(config, device):
        # The same kernel as max_regs=0: the search would measure it twice.
        return [f"max_regs {config.max_regs} changes nothing: the register estimate already "
                f"asks for {uncapped} blocks of {config.threads} threads per SM"]
    return []


def _bulk_reasons(config: KernelConfig, problem: Problem, device: DeviceLimits) -> list[str]:
    """The rules of the bulk-copy kernel (cache="bulk") beyond the common ones."""
    reasons = []
    if device.cc < 90:
        reasons.append("the bulk-copy kernel needs compute capability 9.0 or newer (TMA)")
    if config.stages < 1:
        reasons.append("the bulk-copy kernel needs stages >= 1")
    if config.vec * problem.itemsize != 16:
        reasons.append("the bulk-copy kernel reads 16-byte vectors: vec must be 16 bytes")
    if config.stats != "two_pass":
        # It reads the staged row from shared memory twice; one-pass Welford would save nothing.
        reasons.append("the bulk-copy kernel computes two-pass statistics only")
    if config.blocks_per_sm:
        reasons.append("the bulk-copy kernel's grid is sized by occupancy: blocks_per_sm is 0")
    if config.max_regs:
        reasons.append("the bulk-copy kernel sizes its own occupancy: max_regs is 0")
    shape = derive_shape(config, problem)
    if config.threads < 128:
        # One thread issues a block's copies and all wait on it: blocks of one or two warps
        # won nothing in the lab sweep and spilled in nvcc sweeps (1 warp, fp16 4096, 16 B).
        reasons.append("the bulk-copy kernel needs at least 128 threads per block")
    if shape.threads_per_row < 32:
        # Sub-warp rows spilled at the occupancy their shared memory allows (fp16 768, 8
        # threads per row, 96 B; nvcc 13.0 sweep) and won nothing in the lab sweep.
        reasons.append("the bulk-copy kernel gives each row at least one warp")
    iters = shape.iters
    if config.rows_per_block > 1 and iters > BULK_MAX_ITERS // 2:
        # Several rows per block at 8 vectors per thread spilled 16-104 B even at 128
        # registers (bf16/fp16 2048, nvcc 13.0 sweeps); more threads per row avoid it.
        reasons.append(f"{iters} vectors per thread with several rows per block (the bulk "
                       f"kernel allows {BULK_MAX_ITERS // 2})")
    elif iters > BULK_MAX_ITERS:
        # Its loops are unrolled over a thread's vectors: at 16 vectors ptxas wanted more than
        # 128 registers (fp32 2048, 2 blocks of 256 threads: 40 B spilled), at 64 it used 255
        # and spilled 1 KB (nvcc 13.0 sweeps). The lab's winners all had 8 or fewer.
        reasons.append(f"{iters} vectors per thread per row (the bulk kernel unrolls at most "
                       f"{BULK_MAX_ITERS})")
    return reasons


def is_valid(config: KernelConfig, problem: Problem, device: DeviceLimits = H200) -> bool:
    """Return True if ``config`` can run ``problem`` on ``device``."""
    return not check(config, problem, device)


def require_valid(
    config: KernelConfig,
    problem: Problem,
    device: DeviceLimits = H200,
    *,
    allow_unstable: bool = False,
) -> None:
    """Raise :class:`ConfigError` naming every reason ``config`` is invalid."""
    reasons = check(config, problem, device, allow_unstable=allow_unstable)
    if reasons:
        raise ConfigError(f"{config.label()} cannot run {problem}: " + "; ".join(reasons))
