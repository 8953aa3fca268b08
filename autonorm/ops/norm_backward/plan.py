"""The launch plan of a backward kernel, derived once from (config, problem), and its rules.

:func:`derive_plan` sizes a kernel (vectors per thread, shared memory, registers) and
:func:`check` says why a configuration cannot run a problem on a device; rendering
(:mod:`.codegen`) formats the plan and derives nothing itself.

Pure logic: no CuPy, no GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from autonorm.errors import ConfigError
from autonorm.ops.base import domain_reasons
from autonorm.ops.norm_backward.config import (
    ACCS,
    BLOCKS_PER_SM,
    CACHES,
    CLUSTERS,
    GROUPS,
    LANES_MIN_THREADS,
    MAX_CLUSTER_BLOCKS,
    STAGES,
    THREADS,
    VECS,
)
from autonorm.ops.norm_backward.config import BackwardConfig as Config
from autonorm.ops.norm_backward.problem import BackwardProblem

# Elements a thread may hold per row in registers, for the row (x and dy) and for the column
# sums: past these the estimate below spills at any occupancy worth having.
MAX_CACHED = 32
MAX_SUMMED = 32

# Vectors a thread may take per row with the row in registers: those loops unroll fully, and
# past this the code grows without gaining loads in flight (a reloaded row's loops unroll four
# vectors at a time, so it has no such bound).
MAX_ITERS = 32

# Elements of a row one thread may sum: its sums run in one fp32 chain, and at 2,048 elements
# (RMSNorm, fp32, hidden 65536 on one warp) sum(x^2) of a constant row was off by 1.2e-5.
MAX_CHAIN = 512

# Registers a thread needs besides what it holds: indices, pointers, statistics, the output
# vector (the estimate's constant).
BASE_REGS = 64

# The clusters that take rows, where there are few: each of up to SPREAD_ROWS rows has a cluster
# of its own, and past that a cluster takes at least ROWS_PER_CLUSTER rows. A cluster that takes
# rows writes a row of column sums to the partials, which every block then reads back: at few
# rows those bytes outweigh the rows' own, and one row a cluster spends them all.
SPREAD_ROWS = 16
ROWS_PER_CLUSTER = 4

# The defaults split rows past SPLIT_ABOVE elements over a cluster of blocks (space.py) and
# keep shorter ones whole, at any row count. With the cluster's one-way exchange, the split was
# the fastest or within 2 points of copy of it at every shape timed from 12288 to 32768 (both
# norms, bf16 and fp32), and whole rows kept the lead at 8192 (77.0% of copy against 70.8% for
# a cluster of two, LayerNorm bf16; H200, docs/backward.md).
SPLIT_ABOVE = 8192

# Static shared memory: two reduction buffers of 32 warps x TOTALS floats, and the
# column tile of the final sums (128 floats a warp).
TILE_BYTES_PER_WARP = 128 * 4
# Sums a reduction passes at once: LayerNorm's statistics take one reduction of four (the
# shifted sums), RMSNorm's one of two.
TOTALS = {"layer": 4, "rms": 2}
# Totals a held row's exchange by lanes passes: one a lane of a warp, from every block of the
# cluster.
LANES_EXCHANGED = 32
# LayerNorm's one-pass statistics about the shift (the row's first element) stand where
# cmean^2 <= SHIFT_NEAR * var, cmean being the mean less the shift: the shift lies within two
# standard deviations of the mean and the sums about it cancel by at most 1 + SHIFT_NEAR. Other
# rows sum about the mean in a second pass (docs/backward.md).
SHIFT_NEAR = 4.0

# A cluster kernel's static shared memory beyond the others': its exchange (two buffers of
# TOTALS floats from each block of the cluster, and an mbarrier a buffer), which ptxas places in
# whole 128-byte units (nvcc 13.0, sm_90, two floats: 128, 128 and 256 bytes more than without a
# cluster for clusters of 2, 4 and 8).
CLUSTER_SMEM_UNIT = 128


def red_bytes(norm: str) -> int:
    """Static shared memory of a kernel's two reduction buffers."""
    return 2 * 32 * TOTALS[norm] * 4


def cluster_exchange_bytes(cluster: int, norm: str) -> int:
    """Static shared memory a cluster of ``cluster`` blocks adds to each block's kernel."""
    used = 2 * cluster * TOTALS[norm] * 4 + 2 * 8
    return -(-used // CLUSTER_SMEM_UNIT) * CLUSTER_SMEM_UNIT


@dataclass(frozen=True)
class Plan:
    """What a backward kernel is, in numbers.

    Attributes:
        config: the configuration.
        problem: the problem.
        seg: elements of a row one block takes (the hidden size over the cluster).
        nvec: vectors per row a block takes.
        iters: vectors per thread per row.
        even: every thread has a vector in every iteration (no guard).
        smem_bytes: dynamic shared memory: the column sums of ``acc="smem"``, then a bulk
            kernel's stages (x's, then dy's) and their mbarriers.
        stage_offset: where the stages start in the dynamic shared memory (bytes); with
            groups, the sums held in registers meet there once the rows are done.
        bars_offset: where the stages' mbarriers start in the dynamic shared memory (bytes).
        static_smem: static shared memory.
        regs: the register estimate per thread.
    """

    config: Config
    problem: BackwardProblem
    seg: int
    nvec: int
    iters: int
    even: bool
    smem_bytes: int
    stage_offset: int
    bars_offset: int
    static_smem: int
    regs: int

    @property
    def sums(self) -> int:
        """Column sums (0, 1 or 2)."""
        return self.problem.sums


def register_cap(config: Config, device: object) -> int:
    """Registers a thread may use at ``config``'s occupancy (``blocks_per_sm`` blocks an SM)."""
    threads = config.threads * config.blocks_per_sm
    return min(255, device.regs_per_sm // threads)  # type: ignore[attr-defined]


def derive_plan(config: Config, problem: BackwardProblem) -> Plan:
    """Size ``config`` on ``problem`` (no validity check: :func:`check` does that)."""
    seg = problem.hidden // config.cluster
    nvec = max(1, seg // config.vec)
    iters = -(-nvec // config.threads)
    elems = iters * config.vec
    words = elems * problem.itemsize / 4  # 32-bit registers holding elems stored values
    regs = BASE_REGS + config.vec
    if config.cache == "registers":
        rows_held = 2 if config.prefetch else 1
        regs += int(2 * rows_held * words)
    if config.cache != "none" and problem.has_weight:
        regs += int(words)  # the weight, loaded once per block
    if config.hold:
        # x and g = dy * w in fp32 (and dy where the sums need it apart from g), less what the
        # passes no longer convert. Fitted to ptxas (nvcc 13.0, sm_90, 636 held bulk kernels of
        # both norms, plain and fused, bf16 and fp32, hidden 1024-65536, each near its register
        # cap): at these rates none that fits spills; RMSNorm at 1 an element, 10 did. LayerNorm's
        # one-pass statistics hold more: 68 of 347 near their cap spill (docs/backward.md).
        regs += elems if problem.norm == "layer" else elems * 3 // 2
    if config.acc == "registers":
        regs += problem.sums * elems
    sums = problem.sums * seg * 4 if config.acc == "smem" else 0
    smem = sums
    if config.cache == "bulk":
        # x's and dy's rows (this block's share) per stage, then one 8-byte mbarrier a stage.
        # Groups whose sums are in registers put them where the stages were, to meet.
        staged = 2 * config.stages * seg * problem.itemsize
        if config.groups > 1 and config.acc == "registers":
            staged = max(staged, problem.sums * seg * 4)
        bars = smem + staged
        smem = bars + 8 * config.stages
    else:
        bars = smem
    static = red_bytes(problem.norm) + (config.threads // 32) * TILE_BYTES_PER_WARP
    if config.cluster > 1:
        static += cluster_exchange_bytes(config.cluster, problem.norm)
    return Plan(config, problem, seg, nvec, iters, nvec % config.threads == 0, smem, sums,
                bars, static, regs)


def check(config: Config, problem: BackwardProblem, device: object) -> list[str]:
    """Return why ``config`` cannot run ``problem`` on ``device`` (empty when it can)."""
    reasons = domain_reasons(config, {
        "threads": THREADS, "vec": VECS, "cache": CACHES, "acc": ACCS,
        "blocks_per_sm": BLOCKS_PER_SM, "stages": STAGES, "cluster": CLUSTERS,
        "groups": GROUPS})
    if reasons:
        return reasons
    if config.vec * problem.itemsize > 16:
        reasons.append(f"vec {config.vec} of {problem.dtype} is wider than 16 bytes")
    if problem.hidden % config.vec:
        reasons.append(f"vec {config.vec} does not divide hidden {problem.hidden}")
        return reasons
    if problem.hidden % (config.vec * config.cluster):
        reasons.append(f"a cluster of {config.cluster} cannot split hidden {problem.hidden} "
                       f"into whole vectors of {config.vec}")
        return reasons
    plan = derive_plan(config, problem)
    if plan.nvec < config.threads and config.threads > THREADS[0]:
        # One warp is the smallest block: rows shorter than it leave lanes idle anyway.
        reasons.append(f"{config.threads} threads for {plan.nvec} vectors: some would idle")
    if config.cache != "none" and plan.iters > MAX_ITERS:
        reasons.append(f"{plan.iters} vectors a thread exceed {MAX_ITERS}")
    elems = plan.iters * config.vec
    if elems > MAX_CHAIN:
        reasons.append(f"{elems} elements a thread exceed the {MAX_CHAIN} one fp32 sum may take")
    reasons += _bulk_reasons(config, problem, device)
    if config.cache == "registers" and elems > MAX_CACHED:
        reasons.append(f"{elems} elements a thread exceed {MAX_CACHED} cached in registers")
    if config.hold and elems > MAX_CACHED:
        reasons.append(f"{elems} elements a thread exceed {MAX_CACHED} held in registers")
    if config.lanes and config.threads < LANES_MIN_THREADS:
        reasons.append(f"lanes add the totals of warps: {config.threads} threads are one warp")
    if config.lanes and config.hold and config.cluster * TOTALS[problem.norm] > LANES_EXCHANGED:
        # A held row's exchange by lanes gives each lane of a warp one total of one block.
        reasons.append(f"lanes exchange {config.cluster} blocks' {TOTALS[problem.norm]} totals "
                       f"one a lane: at most {LANES_EXCHANGED}")
    if config.prefetch and config.cache != "registers":
        reasons.append("prefetch holds the next row in registers: it needs cache=registers")
    if config.cache == "none" and config.acc == "registers" and problem.sums:
        reasons.append("column sums in registers need the row in registers (unrolled loops)")
    if problem.sums == 0 and config.acc != "registers":
        reasons.append("no weight or bias: there are no column sums to place")
    if config.acc == "registers" and problem.sums * elems > MAX_SUMMED:
        reasons.append(f"{problem.sums * elems} column sums a thread exceed {MAX_SUMMED} "
                       "registers")
    smem = plan.smem_bytes + plan.static_smem
    if smem > device.max_smem_optin:  # type: ignore[attr-defined]
        reasons.append(f"{smem} bytes of shared memory exceed the block's "
                       f"{device.max_smem_optin}")  # type: ignore[attr-defined]
    elif smem * config.blocks_per_sm > device.smem_per_sm:  # type: ignore[attr-defined]
        reasons.append(f"{config.blocks_per_sm} blocks of {smem} bytes of shared memory do not "
                       "fit an SM")
    threads = config.threads * config.blocks_per_sm
    if threads > device.max_threads_per_sm:  # type: ignore[attr-defined]
        reasons.append(f"{threads} threads per SM exceed {device.max_threads_per_sm}")  # type: ignore[attr-defined]
    else:
        cap = register_cap(config, device)
        if plan.regs > cap:
            reasons.append(f"about {plan.regs} registers a thread exceed {cap} at "
                           f"{config.blocks_per_sm} blocks per SM")
    return reasons


def _bulk_reasons(config: Config, problem: BackwardProblem, device: object) -> list[str]:
    """Return why the bulk-copy stages of ``config`` cannot run (empty when they can)."""
    if config.cache != "bulk":
        reasons = [] if config.stages == 0 else ["stages apply to cache='bulk' only; use 0"]
        if config.cluster > 1:
            reasons.append("clusters split rows of bulk-copy kernels only (cache='bulk')")
        if config.hold:
            reasons.append("hold reads a row from its bulk-copy stage (cache='bulk')")
        if config.groups > 1:
            reasons.append("groups take rows in bulk-copy kernels only (cache='bulk')")
        return reasons
    reasons = []
    if config.stages == 0:
        reasons.append("cache='bulk' needs 1 or more stages")
    if device.cc < 90:  # type: ignore[attr-defined]
        reasons.append("the bulk-copy engine needs compute capability 9.0 or newer")
    elif config.cluster > device.max_cluster_blocks:  # type: ignore[attr-defined]
        reasons.append(f"a cluster of {config.cluster} blocks exceeds the "
                       f"{device.max_cluster_blocks} this device launches")  # type: ignore[attr-defined]
    if config.vec * problem.itemsize != 16:
        # Stage reads are 16-byte vectors, and a row copy must be a multiple of 16 bytes.
        reasons.append("cache='bulk' takes 16-byte vectors")
    if config.groups > 1:
        if config.cluster * config.groups > MAX_CLUSTER_BLOCKS:
            reasons.append(f"a cluster of {config.cluster} x {config.groups} groups exceeds "
                           f"{MAX_CLUSTER_BLOCKS} blocks")
        if not problem.sums:
            reasons.append("groups meet their column sums: there are none to meet")
        if config.acc in ("global", "reread"):
            reasons.append("groups meet sums held in registers or shared memory, not "
                           f"acc={config.acc!r}")
        if config.blocks_per_sm != 1:
            # A kernel of groups launches one cluster: occupancy sizes no grid.
            reasons.append("groups launch one cluster: blocks_per_sm must be 1")
    return reasons


def require_valid(config: Config, problem: BackwardProblem, device: object) -> Plan:
    """Return the plan of a valid ``config``.

    Raises:
        autonorm.errors.ConfigError: the configuration cannot run the problem (all reasons).
    """
    reasons = check(config, problem, device)
    if reasons:
        raise ConfigError(f"{config.label()} cannot run {problem.describe()}: "
                          + "; ".join(reasons))
    return derive_plan(config, problem)
