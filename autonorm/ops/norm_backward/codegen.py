"""Render a backward kernel: (BackwardConfig, problem) into CUDA C++ source and its launch plan.

Pure and deterministic, as the forward's rendering: no GPU, no CuPy.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from autonorm import __version__
from autonorm.codegen.environment import environment
from autonorm.codegen.kernel import LaunchPlan, RenderedKernel
from autonorm.codegen.spellings import dtype_names
from autonorm.ops.norm_backward.config import BackwardConfig
from autonorm.ops.norm_backward.plan import (
    ROWS_PER_CLUSTER,
    SHIFT_NEAR,
    SPREAD_ROWS,
    TOTALS,
    Plan,
    require_valid,
)
from autonorm.ops.norm_backward.problem import BackwardProblem
from autonorm.runtime.limits import H200, DeviceLimits

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"
TEMPLATE = "norm_bwd.cu.j2"
KERNEL_TEMPLATES = (TEMPLATE, "reduce.cuh.j2", "convert.cuh.j2", "mbarrier.cuh.j2")

# Fields added after kernels were named: at their defaults they stay out of a kernel's name.
LATE_FIELDS = ("hold", "groups", "lanes")

# Columns of one tile of the final column sums (4 a lane of one warp; the template's 128).
COLUMN_TILE = 128
# Columns of a tile of sums formed again from the rows (acc="reread"): one a lane.
REREAD_TILE = 32


@functools.lru_cache(maxsize=1)
def templates_hash() -> str:
    """Return a 12-hex hash of the kernel templates (names the studies of a search)."""
    env = environment(TEMPLATE_DIR)
    digest = hashlib.sha256()
    for name in sorted(KERNEL_TEMPLATES):
        digest.update(name.encode())
        digest.update(Path(env.loader.get_source(env, name)[1]).read_bytes())
    return digest.hexdigest()[:12]


def code_version() -> str:
    """Return the package version and the templates' hash, e.g. ``0.1.0+1a2b3c4d5e6f``."""
    return f"{__version__}+{templates_hash()}"


def kernel_name(config: BackwardConfig, problem: BackwardProblem) -> str:
    """Return the unique, deterministic C name of a kernel."""
    # A field that kernels were once named without stays out of the text at its default, so
    # those kernels keep their names (and stored winners their digests).
    unnamed = BackwardConfig()
    fields = {k: v for k, v in config.to_dict().items()
              if k not in LATE_FIELDS or v != getattr(unnamed, k)}
    text = repr((sorted(fields.items()), problem))
    prefix = "autonorm_ln_bwd_" if problem.norm == "layer" else "autonorm_rms_bwd_"
    return prefix + hashlib.sha256(text.encode()).hexdigest()[:16]


def render(
    config: BackwardConfig, problem: BackwardProblem, device: DeviceLimits | None = None
) -> RenderedKernel:
    """Render the kernel of ``config`` for ``problem``.

    Raises:
        autonorm.errors.ConfigError: the configuration cannot run the problem.
    """
    plan = require_valid(config, problem, device or H200)
    name = kernel_name(config, problem)
    source = environment(TEMPLATE_DIR).get_template(TEMPLATE).render(**_context(plan, name))
    # Sums formed again from the rows take every row a cluster and tiles of a column a lane.
    reread = config.acc == "reread"
    launch = LaunchPlan(
        threads=config.threads,
        smem_bytes=plan.smem_bytes,
        cluster=config.cluster * config.groups,
        rows_per_block=ROWS_PER_CLUSTER if problem.sums and not reread else 1,
        blocks_per_sm=config.blocks_per_sm,
        resident=True,
        barrier=problem.sums > 0,
        reduce_tiles=(-(-problem.hidden // REREAD_TILE) if reread
                      else problem.sums * -(-problem.hidden // COLUMN_TILE)),
        spread_rows=SPREAD_ROWS if problem.sums else 0,
        single=config.groups > 1,
    )
    return RenderedKernel(name, source, config, problem, launch)


def _context(plan: Plan, name: str) -> dict[str, object]:
    """The template's names, formatted from ``plan``."""
    config, problem = plan.config, plan.problem
    dtype = problem.dtype
    return {
        "name": name,
        "ns": name + "_ns",
        "label": config.label(),
        "version": code_version(),
        "dtype": dtype,
        **dtype_names(dtype),
        "itemsize": problem.itemsize,
        "has_weight": problem.has_weight,
        "has_bias": problem.has_bias,
        "RMS": problem.norm == "rms",
        "WOFF": problem.weight_offset,
        "N": problem.hidden,
        "V": config.vec,
        "G": config.threads,
        "ITERS": plan.iters,
        "EVEN": plan.even,
        "NACC": problem.sums,
        "AB": problem.has_bias,
        "IB": int(problem.has_weight),
        "BPS": config.blocks_per_sm,
        # Rows not held in registers run their passes' loops four vectors at a time: fully
        # unrolled, the compiler issues every reload first and holds the row anyway.
        "UNROLL": plan.iters if config.cache != "none" else min(plan.iters, 4),
        "cache": config.cache,
        "PREFETCH": config.prefetch,
        "acc": config.acc,
        "S": config.stages,
        "C": config.cluster,
        "R": config.groups,
        "HOLD": config.hold,
        "LANES": config.lanes,
        "RES": problem.residual,
        "STAGE_OFFSET": plan.stage_offset,
        "BARS_OFFSET": plan.bars_offset,
        "SPREAD": SPREAD_ROWS,
        "RPC": ROWS_PER_CLUSTER,
        "XS": TOTALS[problem.norm],
        "SHIFT_NEAR": SHIFT_NEAR,
    }
