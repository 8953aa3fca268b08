"""Render a (KernelConfig, Problem) into CUDA C++ source and its launch plan.

Rendering is pure and deterministic: the same inputs give the same bytes, on any machine, with
no GPU. Compiling is :mod:`autonorm.compiler`'s job.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import jinja2

from autonorm import __version__
from autonorm.codegen.environment import environment
from autonorm.codegen.kernel import LaunchPlan, RenderedKernel
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.plan import (
    SCRATCH_SMEM,
    bulk_occupancy,
    bulk_stage_bytes,
    derive_shape,
    fills_async,
    fuses_passes,
    holds_fp32_row,
    holds_fp32_tile,
    min_blocks_per_sm,
    prefetches,
    smem_bytes,
    unrolls_store,
)
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.rules import require_valid
from autonorm.runtime.limits import H200, DeviceLimits

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"
TEMPLATE = "layer_norm_fwd.cu.j2"
BULK_TEMPLATE = "layer_norm_bulk.cu.j2"  # cache="bulk": rows fetched by the bulk-copy engine

# The templates that make a kernel's device code. Tuned results are keyed by their hash; the
# export launcher templates are host code and do not change what was measured.
KERNEL_TEMPLATES = (
    "layer_norm_fwd.cu.j2",
    "reduce.cuh.j2",
    "convert.cuh.j2",
    "layer_norm_bulk.cu.j2",
)

_CTYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16"}

_TO_FLOAT = {"float32": "a", "float16": "__half2float(a)", "bfloat16": "__bfloat162float(a)"}

_FROM_FLOAT = {
    "float32": "a",
    "float16": "__float2half_rn(a)",
    "bfloat16": "__float2bfloat16_rn(a)",
}

# Two fp32 values to one 32-bit pair of a 16-bit type, in one conversion instruction.
_FROM_FLOAT2 = {"float32": "", "float16": "__floats2half2_rn", "bfloat16": "__floats2bfloat162_rn"}


def template_environment() -> jinja2.Environment:
    """Return the Jinja environment of this family's templates (kernel and export)."""
    return environment(TEMPLATE_DIR)


@functools.lru_cache(maxsize=1)
def templates_hash() -> str:
    """Return a 12-hex hash of the kernel templates (part of the tuning DB key)."""
    digest = hashlib.sha256()
    for name in sorted(KERNEL_TEMPLATES):
        path = environment(TEMPLATE_DIR).loader.get_source(environment(TEMPLATE_DIR), name)[1]
        path = Path(path)
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def code_version() -> str:
    """Return the version string that keys tuned results: package version + template hash."""
    return f"{__version__}+{templates_hash()}"


def kernel_name(config_: KernelConfig, problem: Problem) -> str:
    """Return the unique, deterministic C name of a kernel."""
    text = repr((sorted(config_.to_dict().items()), problem))
    return "autonorm_ln_" + hashlib.sha256(text.encode()).hexdigest()[:16]


def render(
    config_: KernelConfig,
    problem: Problem,
    device: DeviceLimits | None = None,
    *,
    allow_unstable: bool = False,
) -> RenderedKernel:
    """Render the kernel for ``config_`` on ``problem``.

    Args:
        config_: the kernel configuration.
        problem: hidden size, dtype and affine flags.
        device: limits to validate against (H200 when None).
        allow_unstable: allow the deliberately unstable ``naive`` statistics (verifier tests).

    Raises:
        autonorm.space.ConfigError: the configuration is invalid for the problem.

    """
    if device is None:
        require_valid(config_, problem, allow_unstable=allow_unstable)
    else:
        require_valid(config_, problem, device, allow_unstable=allow_unstable)
    shape = derive_shape(config_, problem)
    name = kernel_name(config_, problem)
    bulk = config_.cache == "bulk"
    ftile = holds_fp32_tile(config_, problem)
    if bulk:
        min_blocks, wreg = bulk_occupancy(config_, problem, device or H200)
        wreg = wreg and not ftile
    else:
        min_blocks, wreg = min_blocks_per_sm(config_, problem, device or H200), False
    context = {
        "name": name,
        "ns": name + "_ns",
        "label": config_.label(),
        "version": code_version(),
        "dtype": problem.dtype,
        "ctype": _CTYPES[problem.dtype],
        "to_float": _TO_FLOAT[problem.dtype],
        "from_float": _FROM_FLOAT[problem.dtype],
        "from_float2": _FROM_FLOAT2[problem.dtype],
        "itemsize": problem.itemsize,
        "has_weight": problem.has_weight,
        "has_bias": problem.has_bias,
        "N": problem.hidden,
        "SEG": shape.segment,
        "NVEC": shape.segment // config_.vec,
        "V": config_.vec,
        "G": shape.threads_per_row,
        "R": config_.rows_per_block,
        "C": config_.cluster,
        "ITERS": shape.iters,
        "EVEN": shape.even,
        "NWARP_G": max(shape.threads_per_row // 32, 1),
        "threads": config_.threads,
        "ONE_PASS": fuses_passes(config_, problem),
        "min_blocks": min_blocks,
        "cache": config_.cache,
        "PREFETCH": prefetches(config_),
        "FCACHE": holds_fp32_row(config_, problem),
        "ASYNC_FILL": fills_async(config_, problem, device or H200),
        "UNROLL_STORE": unrolls_store(config_, problem, device or H200),
        "stats": config_.stats,
        "scratch_bytes": SCRATCH_SMEM,
        "STAGES": config_.stages,
        "KEEP_X": config_.keep_x,
        "WREG": wreg,
        "FTILE": ftile,
        "stage_bytes": bulk_stage_bytes(config_, problem),
    }
    template = BULK_TEMPLATE if bulk else TEMPLATE
    source = template_environment().get_template(template).render(**context)
    plan = LaunchPlan(
        threads=config_.threads,
        smem_bytes=smem_bytes(config_, problem),
        cluster=config_.cluster,
        rows_per_block=config_.rows_per_block,
        blocks_per_sm=min_blocks if bulk else config_.blocks_per_sm,
        resident=bulk,
    )
    return RenderedKernel(name, source, config_, problem, plan)
