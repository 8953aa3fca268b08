"""Validity: why a configuration cannot run a problem on a device, said before anything compiles.

:func:`check` tests a configuration's fields against their domains, derives its plan
(:func:`autonorm.ops.layer_norm.plan.derive_plan`) and judges the plan: the rules common to both
kernels here, the register and spill rules of the row kernel in :mod:`.rules_registers`, the
bulk-copy kernel's own in :mod:`.rules_bulk`. :func:`require_valid` returns the plan it judged,
which rendering reads.

Pure logic: no CuPy, no GPU.
"""

from __future__ import annotations

from autonorm.errors import ConfigError
from autonorm.ops.base import domain_reasons
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
    EARLY_AFFINE_ITERS,
    EARLY_AFFINE_MAX_ITERS,
    Plan,
    derive_plan,
    early_affine_applies,
)
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.rules_bulk import bulk_reasons
from autonorm.ops.layer_norm.rules_registers import max_regs_reasons, register_reasons
from autonorm.runtime.limits import H200, DeviceLimits

# Longest Welford run one thread may make. Its M2 grows by many small updates, each rounded
# relative to the running total, so the error grows with the run: on the verifier's
# outlier-first case (fp32, two elements 3000 spreads above a mean-1000 row, one thread per row)
# the H200 measured 5.0e-6 at 6,500 elements (tolerance 2e-6), and an fp32 emulation of the
# kernel's updates gives 7.7e-6 at 8192, 1.4e-6 at 4096, 4.8e-7 at 2048. 16-bit rows keep a cap
# of 8192 (65,536 elements per thread measured 6e-6): their tolerances are 1e-3 / 8e-3
# (docs/accuracy.md).
WELFORD_RUN_MAX = 2048

WELFORD_RUN_MAX_16BIT = 8192

# Longest fp32 two-pass run one thread may make. After an outlier, each of the run's small
# squares is rounded relative to the outlier's: on the verifier's outlier-first case (two
# elements 3000 spreads above a mean-1000 row) 8 threads a row at fp32 12289, 1,536 elements
# each, measured 2.3e-6 and 2.4e-6 on the H200 (tolerance 2e-6; docs/accuracy.md).
TWO_PASS_RUN_MAX = 512


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
    return _judge(config, problem, device, allow_unstable)[0]


def is_valid(config: KernelConfig, problem: Problem, device: DeviceLimits = H200) -> bool:
    """Return True if ``config`` can run ``problem`` on ``device``."""
    return not check(config, problem, device)


def require_valid(
    config: KernelConfig,
    problem: Problem,
    device: DeviceLimits = H200,
    *,
    allow_unstable: bool = False,
) -> Plan:
    """Return the plan of a valid ``config``; raise :class:`ConfigError` naming every reason not.

    Raises:
        ConfigError: ``config`` cannot run ``problem`` on ``device``.

    """
    reasons, plan = _judge(config, problem, device, allow_unstable)
    if reasons or plan is None:
        raise ConfigError(f"{config.label()} cannot run {problem}: " + "; ".join(reasons))
    return plan


def _judge(
    config: KernelConfig, problem: Problem, device: DeviceLimits, allow_unstable: bool
) -> tuple[list[str], Plan | None]:
    """The reasons against ``config``, and its plan once its fields lie in their domains."""
    reasons = _domain_reasons(config, problem, allow_unstable)
    if reasons:
        return reasons, None
    plan = derive_plan(config, problem, device)
    reasons = bulk_reasons(plan, device) if plan.bulk else _row_kernel_reasons(plan)
    reasons += _residual_reasons(plan) + _early_reasons(plan)
    if reasons:
        return reasons, plan
    reasons = _common_reasons(plan, device)
    if not plan.bulk:
        reasons += register_reasons(plan, device)
    if plan.smem_bytes > device.max_smem_optin:
        reasons.append(f"needs {plan.smem_bytes} bytes of shared memory (device opt-in limit "
                       f"{device.max_smem_optin})")
    if config.max_regs and not reasons:
        reasons = max_regs_reasons(plan)
    return reasons, plan


def _domain_reasons(config: KernelConfig, problem: Problem, allow_unstable: bool) -> list[str]:
    """Why a field of ``config`` lies outside its domain, or its vectors do not fit the rows."""
    reasons: list[str] = []
    if config.threads not in THREADS:
        reasons.append(f"threads must be one of {THREADS}")
    if config.vec not in VECS:
        reasons.append(f"vec must be one of {VECS}")
    elif config.vec * problem.itemsize > 16:
        reasons.append(f"vec {config.vec} x {problem.itemsize} bytes exceeds a 16-byte access")
    if config.rows_per_block not in ROWS_PER_BLOCK:
        reasons.append(f"rows_per_block must be one of {ROWS_PER_BLOCK}")
    elif config.threads % config.rows_per_block or config.threads < config.rows_per_block:
        reasons.append("rows_per_block must divide threads")
    if config.cache not in CACHES:
        reasons.append(f"cache must be one of {CACHES}")
    stats_ok = STATS + (("naive",) if allow_unstable else ())
    if problem.norm == "rms":
        # RMSNorm's one statistic, the mean of squares, takes no choice: the field keeps its
        # default so that one kernel has one configuration.
        if config.stats != "two_pass":
            reasons.append("RMSNorm has one statistic: stats must be 'two_pass' (its default)")
    elif config.stats not in stats_ok:
        reasons.append(f"stats must be one of {stats_ok}")
    reasons += domain_reasons(config, {"cluster": CLUSTERS, "blocks_per_sm": BLOCKS_PER_SM,
                                       "stages": STAGES, "max_regs": MAX_REGS})
    return reasons


def _row_kernel_reasons(plan: Plan) -> list[str]:
    """The row kernel's own rules (caches none, registers and smem): stages and keep_x."""
    config = plan.config
    reasons = []
    if config.stages:
        reasons.append("stages apply to the bulk-copy kernel only (cache='bulk'); use 0")
    if plan.shape.skewed and plan.prefetch:
        # The prefetched next row starts at another offset into the vector grid than the one
        # held; the prefetching kernel keeps rows on the grid.
        reasons.append(f"vec {config.vec} does not divide hidden {plan.problem.hidden}: a "
                       "prefetching kernel (register cache, persistent grid) needs it to")
    if config.keep_x and config.cluster > 1:
        # Clustered smem kernels with keep_x (16-byte cp.async fills with the hint) raised
        # cudaErrorIllegalInstruction on the H200 where their plain twins verified. Clustered
        # rows win only in the bulk kernel (docs/l2-hints.md).
        reasons.append("keep_x applies to the fwd kernel at cluster 1 only (clustered "
                       "kernels with the hint raised an illegal instruction)")
    elif config.keep_x and plan.async_fill:
        # Kernels whose shared-memory row is filled by cp.async with the hint raised
        # cudaErrorIllegalInstruction where their plain twins verified: every fp32 one-row
        # two-pass kernel tried (4-, 8- and 16-byte fills, a persistent grid too), 16-bit
        # RMSNorm (fp16 4097, bf16 4096) and 16-bit LayerNorm (bf16 16384 t256v4r1 Welford,
        # three grids, on an H100). Others verified; others report ptxas miscompiling the
        # fractional L2 policy keep_x uses on cp.async, so no kernel fills by hinted cp.async;
        # none shipped did (docs/l2-hints.md).
        reasons.append("keep_x is refused to kernels whose shared-memory row is filled by "
                       "cp.async (hinted fills raised an illegal instruction)")
    return reasons


def _early_reasons(plan: Plan) -> list[str]:
    """Where ``early`` (weight and bias loaded beside x) cannot go, or changes nothing.

    Not the affine flags: validity does not depend on them (a problem without weight or bias
    has nothing to load early, and the kernel is the one without the loads).
    """
    config, problem = plan.config, plan.problem
    if not config.early:
        return []
    if config.cache != "registers" or config.cluster > 1:
        return ["early applies to the register row cache at cluster 1 only (cache='registers')"]
    if not early_affine_applies(config, problem, plan.prefetch):
        return ["early needs no persistent grid (blocks_per_sm 0), no register cap (max_regs "
                "0) and no float32 residual beside 16-bit x"]
    iters = plan.shape.iters
    if iters <= EARLY_AFFINE_ITERS:
        return [f"at {iters} vectors a thread the weights load beside x already: leave early "
                "off"]
    if iters > EARLY_AFFINE_MAX_ITERS:
        return [f"early holds the weights of at most {EARLY_AFFINE_MAX_ITERS} vectors a thread; "
                f"this configuration gives a thread {iters}"]
    return []


def _residual_reasons(plan: Plan) -> list[str]:
    """Where the residual add cannot go: it runs where a row is held once it is read.

    The register and shared-memory caches take ``h = x + residual`` as they are filled, the
    bulk-copy kernel as it takes its tile (staged beside the residual's) from shared memory;
    each stores h once and normalizes it. The uncached kernel would re-read both inputs in every
    pass, and a prefetching one holds the next row's x but not its residual. A float32 residual
    beside 16-bit x (``residual_dtype``) takes rows whose vectors are whole.
    """
    config = plan.config
    if not plan.problem.residual:
        return []
    reasons = []
    if config.cache == "none":
        reasons.append("the residual add needs a row cache (registers, smem or bulk), not "
                       "cache='none'")
    elif plan.prefetch:
        reasons.append("the residual add does not prefetch: use blocks_per_sm 0 with a "
                       "register cache")
    if plan.problem.wide_residual and plan.shape.skewed:
        # The skewed rows' partial vectors and pads are written for T's vectors only.
        reasons.append(f"a float32 residual takes rows on the vector grid: vec {config.vec} "
                       f"does not divide hidden {plan.problem.hidden}")
    return reasons


def _common_reasons(plan: Plan, device: DeviceLimits) -> list[str]:
    """The rules of both kernels: clusters, statistics, barriers and idle threads."""
    config, problem, shape = plan.config, plan.problem, plan.shape
    reasons = []
    if config.cluster > 1:
        if device.cc < 90:
            reasons.append("thread-block clusters need compute capability 9.0 or newer")
        if config.rows_per_block != 1:
            reasons.append("a cluster splits one row: rows_per_block must be 1")
        if plan.bulk and not shape.skewed and problem.hidden % (config.cluster * config.vec):
            reasons.append("the bulk-copy kernel's cluster needs cluster x vec to divide hidden "
                           "(equal segments of whole vectors)")
        elif shape.ragged and (config.cluster - 1) * shape.vectors >= -(-problem.hidden
                                                                         // config.vec):
            reasons.append(f"a cluster of {config.cluster} leaves its last block no vectors of "
                           f"a row of {problem.hidden} (runs of {shape.vectors} vectors)")
    # RMSNorm reads its row twice (sum of squares, then scale), not three times, and sums no
    # differences: the two-pass rules below are LayerNorm's.
    layer = problem.norm == "layer"
    if layer and config.stats == "two_pass" and config.cache == "none":
        reasons.append("two_pass statistics re-read the row: they need a row cache")
    if not plan.bulk and shape.threads_per_row > 32 and config.rows_per_block > 15:
        # Rows of several warps synchronise with named barriers 1..rows_per_block; a block has
        # 16 (0..15), so 16 such rows would use barrier 16, which does not exist.
        reasons.append("more than 15 multi-warp rows per block exceed the 16 named barriers")
    if (layer and config.stats == "two_pass" and problem.itemsize == 4 and not plan.bulk
            and shape.iters * config.vec > TWO_PASS_RUN_MAX):
        reasons.append(f"fp32 two-pass over more than {TWO_PASS_RUN_MAX} elements per thread "
                       "loses accuracy after an outlier")
    run_cap = welford_run_cap(problem)
    if config.stats == "welford" and shape.iters * config.vec > run_cap:
        reasons.append(
            f"welford over more than {run_cap} elements per thread loses fp32 accuracy"
        )
    if shape.vectors * 2 <= shape.threads_per_row:
        reasons.append(
            f"{shape.threads_per_row} threads per row for {shape.vectors} vectors: over half "
            "the threads would idle"
        )
    return reasons
