"""LayerNorm forward, the first kernel family: the row kernels and the bulk-copy kernel.

``y = (x - mean) / sqrt(var + eps) * weight + bias`` over the last dimension, with fp32
statistics around a per-row shift. Each module holds one part of the family:
:mod:`.problem` (what is normalized), :mod:`.config` (one point of the template family),
:mod:`.shape` and :mod:`.occupancy` (what a configuration derives), :mod:`.plan` (every derived
fact, gathered once), :mod:`.rules` with :mod:`.rules_registers` and :mod:`.rules_bulk`
(validity), :mod:`.space` (enumeration, the default and the search's seeds), :mod:`.codegen`
(rendering), :mod:`.reference` (float64), :mod:`.verify` (the GPU check) and :mod:`.family`
(the :class:`autonorm.ops.base.Family` the generic layers see).
"""

from autonorm.codegen.kernel import DYNAMIC_MIN_TILES, LaunchPlan, RenderedKernel
from autonorm.dtypes import DTYPES, ITEMSIZE, SHORT_DTYPES, normalize_dtype
from autonorm.errors import ConfigError
from autonorm.ops.base import rows_bucket
from autonorm.ops.layer_norm.codegen import (
    BULK_TEMPLATE,
    KERNEL_TEMPLATES,
    TEMPLATE,
    TEMPLATE_DIR,
    code_version,
    kernel_name,
    render,
    template_environment,
    templates_hash,
)
from autonorm.ops.layer_norm.config import (
    BLOCKS_PER_SM,
    BULK_FIXED,
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
from autonorm.ops.layer_norm.occupancy import (
    BULK_MAX_WEIGHT_ITERS,
    BULK_OTHER_REGS,
    OTHER_REGS,
    capped_blocks,
)
from autonorm.ops.layer_norm.plan import (
    ASYNC_FILL_ITERS,
    FP32_ROW_MAX,
    FP32_TILE_MAX,
    UNROLL_STORE_ITERS,
    Plan,
    bulk_occupancy,
    bulk_stage_bytes,
    derive_plan,
    fills_async,
    fuses_passes,
    holds_fp32_row,
    holds_fp32_tile,
    min_blocks_per_sm,
    prefetches,
    register_estimate,
    smem_bytes,
    unrolls_store,
)
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.reference import (
    chan_merge,
    layer_norm_cpu,
    layer_norm_reference,
    welford,
)
from autonorm.ops.layer_norm.rules import (
    WELFORD_RUN_MAX,
    WELFORD_RUN_MAX_16BIT,
    check,
    is_valid,
    require_valid,
    welford_run_cap,
)
from autonorm.ops.layer_norm.rules_bulk import BULK_MAX_ITERS
from autonorm.ops.layer_norm.rules_registers import (
    MAX_CACHE_ELEMS,
    MAX_CACHE_ITERS,
    MAX_REGS_CACHE_ELEMS,
    MAX_REGS_CACHE_ITERS,
)
from autonorm.ops.layer_norm.shape import SCRATCH_SMEM, Shape, bulk_scratch_bytes, derive_shape
from autonorm.ops.layer_norm.space import (
    MAX_BULK_SEEDS,
    add_first_valid,
    bulk_seed_configs,
    default_config,
    enumerate_space,
    iter_space,
    latency_seed_configs,
    seed_configs,
)
from autonorm.ops.layer_norm.verify import (
    OUTLIER_CASE,
    VERIFY_ROWS,
    Case,
    VerifyResult,
    make_affine,
    make_cases,
    verify,
)
from autonorm.runtime.limits import H200, DeviceLimits

__all__ = [
    "ASYNC_FILL_ITERS",
    "BLOCKS_PER_SM",
    "BULK_FIXED",
    "BULK_MAX_ITERS",
    "BULK_MAX_WEIGHT_ITERS",
    "BULK_OTHER_REGS",
    "BULK_TEMPLATE",
    "CACHES",
    "CLUSTERS",
    "DTYPES",
    "DYNAMIC_MIN_TILES",
    "FP32_ROW_MAX",
    "FP32_TILE_MAX",
    "H200",
    "ITEMSIZE",
    "KERNEL_TEMPLATES",
    "MAX_BULK_SEEDS",
    "MAX_CACHE_ELEMS",
    "MAX_CACHE_ITERS",
    "MAX_REGS",
    "MAX_REGS_CACHE_ELEMS",
    "MAX_REGS_CACHE_ITERS",
    "OTHER_REGS",
    "OUTLIER_CASE",
    "ROWS_PER_BLOCK",
    "SCRATCH_SMEM",
    "SHORT_DTYPES",
    "STAGES",
    "STATS",
    "TEMPLATE",
    "TEMPLATE_DIR",
    "THREADS",
    "UNROLL_STORE_ITERS",
    "VECS",
    "VERIFY_ROWS",
    "WELFORD_RUN_MAX",
    "WELFORD_RUN_MAX_16BIT",
    "Case",
    "ConfigError",
    "DeviceLimits",
    "KernelConfig",
    "LaunchPlan",
    "Plan",
    "Problem",
    "RenderedKernel",
    "Shape",
    "VerifyResult",
    "add_first_valid",
    "bulk_occupancy",
    "bulk_scratch_bytes",
    "bulk_seed_configs",
    "bulk_stage_bytes",
    "capped_blocks",
    "chan_merge",
    "check",
    "code_version",
    "default_config",
    "derive_plan",
    "derive_shape",
    "enumerate_space",
    "fills_async",
    "fuses_passes",
    "holds_fp32_row",
    "holds_fp32_tile",
    "is_valid",
    "iter_space",
    "kernel_name",
    "latency_seed_configs",
    "layer_norm_cpu",
    "layer_norm_reference",
    "make_affine",
    "make_cases",
    "min_blocks_per_sm",
    "normalize_dtype",
    "prefetches",
    "register_estimate",
    "render",
    "require_valid",
    "rows_bucket",
    "seed_configs",
    "smem_bytes",
    "templates_hash",
    "unrolls_store",
    "verify",
    "welford",
    "welford_run_cap",
]
