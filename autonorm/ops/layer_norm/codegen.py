"""Render a LayerNorm kernel: a (KernelConfig, Problem) into CUDA C++ source and its launch plan.

:func:`render` checks the configuration, takes the plan the check judged
(:func:`autonorm.ops.layer_norm.rules.require_valid`) and formats it into the row kernel's
template or the bulk-copy kernel's: it derives nothing itself. Rendering is pure and
deterministic: the same inputs give the same bytes, on any machine, with no GPU. Compiling is
:mod:`autonorm.runtime.compiler`'s job.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import jinja2

from autonorm import __version__
from autonorm.codegen.environment import environment
from autonorm.codegen.kernel import LaunchPlan, RenderedKernel
from autonorm.codegen.spellings import dtype_names
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.plan import FUSED_SHIFT_ELEMENTS, Plan
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.rules import require_valid
from autonorm.ops.layer_norm.shape import SCRATCH_SMEM, span_vectors
from autonorm.runtime.limits import H200, DeviceLimits

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"
TEMPLATE = "layer_norm_fwd.cu.j2"
BULK_TEMPLATE = "layer_norm_bulk.cu.j2"  # cache="bulk": rows fetched by the bulk-copy engine

# The templates that make a kernel's device code: the two kernels and every template they
# import, from this folder or the shared one. code_version() hashes them to name the studies of
# a search; the export launcher templates are host code and do not change what is measured.
KERNEL_TEMPLATES = (
    "layer_norm_fwd.cu.j2",
    "reduce.cuh.j2",
    "convert.cuh.j2",
    "skew.cuh.j2",
    "mbarrier.cuh.j2",
    "layer_norm_bulk.cu.j2",
)

def template_environment() -> jinja2.Environment:
    """Return the Jinja environment of this family's templates (kernel and export)."""
    return environment(TEMPLATE_DIR)


def template_path(name: str) -> Path:
    """Return the file of template ``name``, as the environment finds it (family, then shared)."""
    env = template_environment()
    return Path(env.loader.get_source(env, name)[1])


@functools.lru_cache(maxsize=1)
def templates_hash() -> str:
    """Return a 12-hex hash of the kernel templates (names the studies of a search)."""
    digest = hashlib.sha256()
    for name in sorted(KERNEL_TEMPLATES):
        digest.update(name.encode())
        digest.update(template_path(name).read_bytes())
    return digest.hexdigest()[:12]


def code_version() -> str:
    """Return the package version and the kernel templates' hash, e.g. ``0.1.0+96473fff10af``."""
    return f"{__version__}+{templates_hash()}"


def kernel_name(config: KernelConfig, problem: Problem) -> str:
    """Return the unique, deterministic C name of a kernel.

    A field added to the configuration after winners were tuned enters the name only when set,
    so the kernels that were timed keep their names, and their digests (``early``).
    """
    fields = config.to_dict()
    if not fields["early"]:
        del fields["early"]
    text = repr((sorted(fields.items()), problem))
    prefix = "autonorm_ln_" if problem.norm == "layer" else f"autonorm_{problem.norm}_"
    return prefix + hashlib.sha256(text.encode()).hexdigest()[:16]


def render(
    config: KernelConfig,
    problem: Problem,
    device: DeviceLimits | None = None,
    *,
    allow_unstable: bool = False,
) -> RenderedKernel:
    """Render the kernel for ``config`` on ``problem``.

    Args:
        config: the kernel configuration.
        problem: hidden size, dtype and affine flags.
        device: limits to validate against (H200 when None).
        allow_unstable: allow the deliberately unstable ``naive`` statistics (verifier tests).

    Raises:
        autonorm.errors.ConfigError: the configuration is invalid for the problem.

    """
    plan = require_valid(config, problem, device or H200, allow_unstable=allow_unstable)
    name = kernel_name(config, problem)
    template = BULK_TEMPLATE if plan.bulk else TEMPLATE
    source = template_environment().get_template(template).render(**_context(plan, name))
    launch = LaunchPlan(
        threads=config.threads,
        smem_bytes=plan.smem_bytes,
        cluster=config.cluster,
        rows_per_block=config.rows_per_block,
        # The bulk kernel's persistent grid is sized by its occupancy, the row kernel's by the
        # configuration (0: a block per row tile).
        blocks_per_sm=plan.min_blocks if plan.bulk else config.blocks_per_sm,
        resident=plan.bulk,
    )
    return RenderedKernel(name, source, config, problem, launch)


def _context(plan: Plan, name: str) -> dict[str, object]:
    """The template's names, formatted from ``plan`` (see the templates for their meaning)."""
    config, problem, shape = plan.config, plan.problem, plan.shape
    return {
        "name": name,
        "ns": name + "_ns",
        "label": config.label(),
        "version": code_version(),
        "dtype": problem.dtype,
        **dtype_names(problem.dtype),
        "itemsize": problem.itemsize,
        "has_weight": problem.has_weight,
        "has_bias": problem.has_bias,
        "RMS": problem.norm == "rms",
        "WOFF": problem.weight_offset,
        "RES": problem.residual,
        # A wide residual: the residual and h are float32 beside 16-bit x and y.
        "WIDE": problem.wide_residual,
        "hctype": dtype_names(problem.h_dtype)["ctype"],
        "N": problem.hidden,
        "SEG": shape.segment,
        "NVEC": shape.vectors,
        "V": config.vec,
        "G": shape.threads_per_row,
        "R": config.rows_per_block,
        "C": config.cluster,
        "ITERS": shape.iters,
        "EVEN": shape.even,
        "RAGGED": shape.ragged,
        "SKEW": shape.skewed,
        "PERIOD": shape.period,
        # The last block's run of a skewed row spans at most NTAIL aligned vectors.
        "NTAIL": span_vectors(problem.hidden, shape.head, config.vec)
        - (config.cluster - 1) * shape.vectors,
        "NWARP_G": max(shape.threads_per_row // 32, 1),
        "threads": config.threads,
        "ONE_PASS": plan.fused_passes,
        "FSHIFT_N": min(FUSED_SHIFT_ELEMENTS, problem.hidden),
        "min_blocks": plan.min_blocks,
        "cache": config.cache,
        "PREFETCH": plan.prefetch,
        "FCACHE": plan.fp32_row,
        "ASYNC_FILL": plan.async_fill,
        "UNROLL_STORE": plan.unrolled_store,
        "stats": config.stats,
        "scratch_bytes": SCRATCH_SMEM,
        "STAGES": config.stages,
        "KEEP_X": config.keep_x,
        "WREG": plan.weights_in_registers,
        "WSMEM": plan.weights_in_smem,
        "wsmem_offset": plan.weights_smem_offset,
        "FTILE": plan.fp32_tile,
        "DEFER": plan.deferred_refill,
        "EARLY_AFFINE": plan.early_affine,
        "LEAN": plan.lean_fp32,
        "CLAMP": plan.clamped_tail,
        "stage_bytes": plan.stage_bytes,
    }
