"""Render a (KernelConfig, Problem) into CUDA C++ source and its launch plan.

Rendering is pure and deterministic: the same inputs give the same bytes, on any machine, with
no GPU. Compiling is :mod:`autonorm.compiler`'s job.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

import jinja2

from autonorm import __version__, config
from autonorm.space import (
    H200,
    SCRATCH_SMEM,
    DeviceLimits,
    KernelConfig,
    Problem,
    bulk_occupancy,
    bulk_stage_bytes,
    derive_shape,
    fills_async,
    min_blocks_per_sm,
    prefetches,
    require_valid,
    smem_bytes,
)

TEMPLATE = "layernorm_fwd.cu.j2"
BULK_TEMPLATE = "layernorm_bulk.cu.j2"  # cache="bulk": rows fetched by the bulk-copy engine
# The templates that make a kernel's device code. Tuned results are keyed by their hash; the
# export launcher templates are host code and do not change what was measured.
KERNEL_TEMPLATES = (
    "layernorm_fwd.cu.j2",
    "reduce.cuh.j2",
    "convert.cuh.j2",
    "layernorm_bulk.cu.j2",
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
# Tiles per cluster from which the bulk kernel takes its tiles through the counter (the dynamic
# schedule) instead of round-robin. With the count-out at exit the counter cost a launch ~1 us
# (H200, benchmarks/NOTES.md 92: x0.87-0.96 of static at 1-4 tiles a cluster); counted out at the
# first failed claim (93, 94) the two are level there (x0.996-1.010) and the dynamic one gains from
# 8 (x1.00-1.02) and 16 (x1.02-1.05). Below 8 the static schedule stays: it gains nothing there and
# needs no zeroed counter (none captured into a graph, no workspace for an exported launcher).
DYNAMIC_MIN_TILES = 8


@dataclass(frozen=True)
class LaunchPlan:
    """How to launch a rendered kernel: block, dynamic shared memory and the grid rule."""

    threads: int
    smem_bytes: int
    cluster: int
    rows_per_block: int
    blocks_per_sm: int
    resident: bool = False

    def grid(self, rows: int, sm_count: int, resident_clusters: int | None = None) -> int:
        """Return the number of blocks for ``rows`` rows (a multiple of the cluster size).

        With ``blocks_per_sm == 0`` every row tile gets its own block (cluster); otherwise a
        persistent grid of about ``blocks_per_sm`` blocks per SM strides over the tiles. A
        ``resident`` plan (the bulk-copy kernel) launches as many clusters as can be resident
        at once, ``resident_clusters`` as the occupancy API reports it: a cluster that waits
        for a free GPC would run its share of the tiles after everyone else (clusters of 4
        fill only 120 of the H200's 132 SMs).
        """
        tiles = max(1, -(-rows // self.rows_per_block))
        clusters = tiles
        if self.resident:
            cap = resident_clusters or sm_count * max(self.blocks_per_sm, 1) // self.cluster
            clusters = min(tiles, max(1, cap))
        elif self.blocks_per_sm:
            clusters = min(tiles, max(1, sm_count * self.blocks_per_sm // self.cluster))
        return clusters * self.cluster

    def uses_counter(self, rows: int, grid: int) -> bool:
        """Whether a launch of ``grid`` blocks over ``rows`` rows takes the dynamic schedule.

        Only the bulk-copy kernel (a ``resident`` plan) has one, and it pays only from
        ``DYNAMIC_MIN_TILES`` tiles a cluster; below that the launch passes no counter.
        """
        if not self.resident:
            return False
        tiles = -(-rows // self.rows_per_block)
        return tiles >= DYNAMIC_MIN_TILES * max(1, grid // self.cluster)


@dataclass(frozen=True)
class RenderedKernel:
    """CUDA source of one kernel and everything needed to launch it."""

    name: str
    source: str
    config: KernelConfig
    problem: Problem
    launch: LaunchPlan

    @property
    def source_hash(self) -> str:
        """SHA-256 of the source (the compile cache key, with arch and CUDA version)."""
        return hashlib.sha256(self.source.encode()).hexdigest()


# A 16-bit register row cache is held as fp32 (converted once, not once per pass) up to this
# many elements per thread. Measured on the H200 (NOTES.md, 15): x1.03-1.14 on register-cached
# bf16/fp16 kernels at 1024-4096; ptxas gave t128v8r4 at 1024 96 registers instead of 128. Not
# measured beyond 32 elements, where the fp32 row alone would take 64+ registers.
FP32_ROW_MAX = 32


def holds_fp32_row(config_: KernelConfig, problem: Problem) -> bool:
    """Whether a register row cache holds its 16-bit elements converted to fp32."""
    return (
        config_.cache == "registers" and problem.itemsize == 2
        and derive_shape(config_, problem).iters * config_.vec <= FP32_ROW_MAX
    )


# The bulk kernel holds a 16-bit tile as fp32 in registers up to this many elements per thread
# (then its weights are read from L1 for every row, as in the other kernels, and their register
# budget goes to the tile). Lab 17 (H200): x1.02-1.05 on every 16-element tile (t1024 at 8192
# and 16384); most 32-element tiles at 64 registers spilled 48-56 bytes, and with the grid sized
# for their registers (one 512-thread block per SM) they ran x0.91-1.01 (NOTES.md 25).
FP32_TILE_MAX = 16


def holds_fp32_tile(config_: KernelConfig, problem: Problem) -> bool:
    """Whether the bulk kernel converts its 16-bit tile to fp32 registers once per row."""
    return (
        config_.cache == "bulk" and problem.itemsize == 2
        and derive_shape(config_, problem).iters * config_.vec <= FP32_TILE_MAX
    )


def fuses_passes(config_: KernelConfig, problem: Problem) -> bool:
    """Whether a 16-bit two-pass kernel takes both of its sums in one pass.

    The kernel sums x - shift and its squares through one reduction and takes the centred sum of
    squares as s2 - s1 * mean. That cancels log2(s2 / M2) bits, so where it would cancel over 4
    (the shift, the row's first element, more than 3.9 spreads from the mean; the verifier's
    outlier rows) the kernel runs the second pass over its cached row after all. A 16-bit output
    keeps 8 or 11 bits, so the 4 lost fp32 bits never reach it; fp32 rows keep the corrected
    two-pass. The test must come out the same in every thread that reduces together: a row's
    threads see the same totals, but a cluster's barrier spans every row of its blocks, so
    clusters of multi-row blocks keep two passes.

    A/B on the H200, same configs, interleaved (NOTES.md 80): the shipped 16-bit winners at
    4096-16384 x1.002-1.018, other register and shared-memory configs x1.01-1.11. The bulk
    kernel keeps two passes: its deferred refill waits behind the first row sum's barrier, which
    fusing moves behind the heavier fused pass, and a 2-stage tile at bf16 32768 ran x0.89; fused
    with the refill behind a barrier of its own instead, its c1 winners at 16384-32768 ran
    x0.98-0.99 and its c4 winners at 65536 x1.00-1.01 (NOTES.md 81).
    """
    return (
        config_.cache != "bulk" and problem.itemsize == 2 and config_.stats == "two_pass"
        and (config_.cluster == 1 or config_.rows_per_block == 1)
    )


# The normalize pass of a 16-bit shared-memory row filled by cp.async is unrolled fully, not 4
# vectors deep, when a thread stores at most this many vectors of one row (two-pass statistics,
# one row per block, at most 256 threads, the 64-register cap): every weight/bias load of the
# row is then in flight in one round trip instead of two. Measured on the H200 (NOTES.md 48,
# lab/p3_lab.py): t256v8r1-smem-m64 at 16384 (8 vectors) x1.022 bf16 / x1.034 fp16, at 12288 (6)
# x1.009 / x1.000; at 4 vectors the code is the same. t512v8r1 at bf16 32768 (8 vectors) spilled
# 8 bytes under NVRTC, and nvcc 13.0 spilled 8-16 bytes in Welford kernels and several rows per
# block (sweep of the 980 kernels a looser rule touched), hence the bounds.
UNROLL_STORE_ITERS = 8


def unrolls_store(config_: KernelConfig, problem: Problem, device: DeviceLimits = H200) -> bool:
    """Whether the normalize-and-store pass is unrolled fully instead of 4 vectors deep."""
    return (
        fills_async(config_, problem, device) and problem.itemsize == 2
        and config_.stats == "two_pass" and config_.rows_per_block == 1
        and config_.max_regs > 0 and config_.threads <= 256
        and derive_shape(config_, problem).iters <= UNROLL_STORE_ITERS
    )


@functools.lru_cache(maxsize=1)
def template_environment() -> jinja2.Environment:
    """Return the Jinja environment over the templates directory (kernel and export)."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(config.templates_dir())),
        undefined=jinja2.StrictUndefined,
        trim_blocks=False,
        lstrip_blocks=False,
        keep_trailing_newline=True,
        autoescape=False,
    )


@functools.lru_cache(maxsize=1)
def templates_hash() -> str:
    """Return a 12-hex hash of the kernel templates (part of the tuning DB key)."""
    digest = hashlib.sha256()
    for name in sorted(KERNEL_TEMPLATES):
        path = config.templates_dir() / name
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
