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
import itertools
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

from autonorm.errors import AutonormError

DTypeName = Literal["float32", "float16", "bfloat16"]
CacheKind = Literal["none", "registers", "smem", "bulk"]
StatsKind = Literal["welford", "two_pass", "naive"]

DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")
ITEMSIZE: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2}
# Short names accepted on the command line and in the Python API.
DTYPE_ALIASES: dict[str, str] = {
    "fp32": "float32", "f32": "float32", "float": "float32", "float32": "float32",
    "fp16": "float16", "f16": "float16", "half": "float16", "float16": "float16",
    "bf16": "bfloat16", "bfloat16": "bfloat16",
}
# The short name of each dtype (kernel names, tables).
SHORT_DTYPES: dict[str, str] = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}

THREADS = (32, 64, 128, 256, 512, 1024)
VECS = (1, 2, 4, 8)
ROWS_PER_BLOCK = (1, 2, 4, 8, 16, 32)
CACHES: tuple[str, ...] = ("none", "registers", "smem", "bulk")
STATS: tuple[str, ...] = ("welford", "two_pass")
CLUSTERS = (1, 2, 4, 8)
BLOCKS_PER_SM = (0, 1, 2, 4, 8)
# Row tiles in flight per block of the bulk-copy kernel (cache="bulk"); 0 for the others.
STAGES = (0, 1, 2, 3, 4, 6, 8)
# A register cap per thread (0: none beyond the estimate's occupancy). At 64 a quarter of the SM's
# registers serves 8 warps, so 1,024 threads fit an SM: the 16-bit winners at 768-8192 ran at
# 80-96 registers and 31-35% occupancy (ncu, session 6) and the same configs capped at 64 ran
# x1.03-x1.32 faster in 13 of 15 A/B pairs (bf16 768 91.4% -> 95.5% of copy, bf16 8192
# 85.4% -> 92.3%; H200, 2026-11-30, benchmarks/NOTES.md 34). Some kernels spill under it, so it
# is a search choice: the evaluator rejects those.
MAX_REGS = (0, 64)
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
OTHER_REGS = 40
# Longest Welford run one thread may make. Its M2 grows by many small updates, each rounded
# relative to the running total, so the error grows with the run: on the verifier's
# outlier-first case (fp32, two elements 3000 spreads above a mean-1000 row, one thread per row)
# the H200 measured 5.0e-6 at 6,500 elements (tolerance 2e-6; GPU fuzz test, 2026-11-30) and
# benchmarks/lab/welford_emulation.py reproduces it exactly and gives 7.7e-6 at 8192, 1.4e-6 at
# 4096, 4.8e-7 at 2048. 16-bit rows keep the older cap of 8192 (set when 65,536 elements per
# thread measured 6e-6, NOTES.md 6): their tolerances are 1e-3 / 8e-3.
WELFORD_RUN_MAX = 2048
WELFORD_RUN_MAX_16BIT = 8192
# Shared memory the kernel needs besides the row cache: reduction scratch, 2 buffers x 32 warps x
# 4 floats (Welford's count, shift, mean and M2), plus the cluster exchange slots.
SCRATCH_SMEM = 2 * 32 * 4 * 4 + 2 * 4 * 4
# The bulk-copy kernel's registers besides weights held in registers, and the most weight/bias
# vectors it holds per thread. ptxas -v on sm_90 (lab sweep, 2026-11-29): with weights of 8
# vectors in registers and a cluster of 2 a 512-thread kernel fit 128 registers without spills;
# without weights 64 registers always sufficed.
BULK_OTHER_REGS = 40
BULK_MAX_WEIGHT_ITERS = 8
BULK_MAX_ITERS = 8
# The fields the bulk-copy kernel fixes: two-pass statistics over the staged tile, and a grid
# sized by occupancy (so no blocks_per_sm).
BULK_FIXED: dict[str, object] = {"stats": "two_pass", "blocks_per_sm": 0, "max_regs": 0}


def welford_run_cap(problem: Problem) -> int:
    """The most elements one thread may run Welford over for this problem's dtype."""
    return WELFORD_RUN_MAX if problem.itemsize == 4 else WELFORD_RUN_MAX_16BIT


def bulk_scratch_bytes(stages: int, rows_per_block: int, cluster: int = 1) -> int:
    """Shared memory of the bulk-copy kernel besides its stages.

    That is the stages' mbarriers (a cluster: two more for the exchange), the reduction scratch
    ([2][32][2] floats), the cluster exchange slots ([2][rows][cluster][4] floats), the ring of
    claimed tiles (Q = max(2 x stages, 4) mbarriers and ints) and each stage's tile (ints).
    """
    exchange = 2 * 8 if cluster > 1 else 0
    ring = max(2 * stages, 4)
    return (stages * 8 + exchange + 2 * 32 * 2 * 4 + 2 * rows_per_block * max(cluster, 1) * 4 * 4
            + ring * (8 + 4) + stages * 4)


class ConfigError(AutonormError, ValueError):
    """A configuration cannot run a problem, or no configuration can (unsupported hidden size)."""


def normalize_dtype(dtype: object) -> str:
    """Return the canonical dtype name ('float32', 'float16' or 'bfloat16').

    Args:
        dtype: a name such as "bf16", or any object whose ``str()`` or ``name`` is one.

    Raises:
        ValueError: the dtype is not supported.

    """
    name = getattr(dtype, "name", None) or str(dtype)
    name = name.replace("torch.", "").lower()
    try:
        return DTYPE_ALIASES[name]
    except KeyError:
        raise ValueError(
            f"unsupported dtype {dtype!r}: autonorm supports float32, float16 and bfloat16"
        ) from None


@dataclass(frozen=True)
class Problem:
    """What is normalized: rows of ``hidden`` elements of ``dtype`` (x, y, weight and bias)."""

    hidden: int
    dtype: str = "bfloat16"
    has_weight: bool = True
    has_bias: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", normalize_dtype(self.dtype))
        if not isinstance(self.hidden, int) or self.hidden < 1:
            raise ValueError(f"hidden size must be a positive integer, got {self.hidden!r}")

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return ITEMSIZE[self.dtype]

    @property
    def max_vec(self) -> int:
        """Widest vector (elements) that is a 16-byte load and divides the hidden size."""
        vec = 16 // self.itemsize
        while self.hidden % vec:
            vec //= 2
        return vec


@dataclass(frozen=True)
class DeviceLimits:
    """The device properties that decide validity and launch shapes."""

    name: str = "NVIDIA H200"
    cc: int = 90
    sm_count: int = 132
    max_smem_optin: int = 232448
    regs_per_sm: int = 65536
    max_threads_per_sm: int = 2048
    l2_bytes: int = 62914560
    smem_per_sm: int = 233472

    @property
    def arch(self) -> str:
        """The NVRTC/nvcc architecture name, e.g. ``sm_90``."""
        return f"sm_{self.cc}"


H200 = DeviceLimits()


# The form KernelConfig.label() writes (the stages, keep_x and register-cap suffixes only when
# set).
_LABEL = re.compile(
    r"t(\d+)v(\d+)r(\d+)-([a-z]+)-([a-z_]+)-c(\d+)-p(\d+)(?:-s(\d+))?(-k)?(?:-m(\d+))?")


@dataclass(frozen=True)
class KernelConfig:
    """One point of the template family.

    Attributes:
        threads: threads per block.
        vec: elements per vector access (vec * itemsize <= 16 bytes).
        rows_per_block: rows a block normalizes at once; each row gets threads // rows_per_block
            threads (fewer than 32 gives sub-warp rows for small hidden sizes).
        cache: where the row is held between statistics and normalization: not at all (x is
            read again, from L2 at best), in registers, or in shared memory.
        stats: ``welford`` (one pass, Chan's merge across threads) or ``two_pass`` (mean, then
            the centered sum of squares over the cached row). ``naive`` (E[x^2] - E[x]^2, no
            shift) is deliberately unstable: it exists only to show that verification fails.
        cluster: blocks of a thread-block cluster that share one row (distributed shared
            memory merges their statistics).
        blocks_per_sm: 0 launches one block (cluster) per row tile; k > 0 launches a persistent
            grid of k blocks per SM that strides over the row tiles. The bulk-copy kernel is
            always persistent, sized by occupancy, and takes 0 here.
        stages: bulk-copy kernel only (``cache="bulk"``): row tiles fetched ahead into shared
            memory by the bulk-copy engine (TMA), each tile ``rows_per_block`` rows (segments,
            with a cluster). 0 for every other cache.
        max_regs: 0 lets the register estimate set the occupancy ptxas aims at; k > 0 caps a
            thread at k registers (``__launch_bounds__`` asks for that many more blocks per
            SM). The bulk-copy kernel sizes its own occupancy and takes 0.
        keep_x: x's loads (the bulk kernel's copies, the other kernels' vector loads and
            shared-memory fills) carry an L2 ``evict_last`` hint, so L2 keeps x's lines ahead
            of y's. The bulk kernel ran x1.02-1.05 at nine winners (H200, benchmarks/NOTES.md
            117), the fwd kernel x1.01-1.03 at the 16-bit winners of 768-4096 and x1.00 at
            8192 and fp32 (121). A GEMM reading y after it lost nothing; a kernel that re-reads
            16-40 MB from L2 right after it pays 0.2-3.6 us. Dispatch drops it under
            ``AUTONORM_NO_KEEP_X=1``. Outside the bulk kernel, cluster 1 only.

    """

    threads: int = 256
    vec: int = 8
    rows_per_block: int = 1
    cache: str = "registers"
    stats: str = "welford"
    cluster: int = 1
    blocks_per_sm: int = 0
    stages: int = 0
    max_regs: int = 0
    keep_x: bool = False

    def to_dict(self) -> dict[str, object]:
        """Return the configuration as a plain dict (for JSON, Optuna and the DB)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> KernelConfig:
        """Build a configuration from :meth:`to_dict` output, ignoring unknown keys.

        The fields the bulk-copy kernel fixes (two-pass statistics, an occupancy grid) take
        those values when absent, as in a tuner trial's parameters.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        if values.get("cache") == "bulk":
            values = {**BULK_FIXED, **values}
        return cls(**values)  # type: ignore[arg-type]

    @property
    def threads_per_row(self) -> int:
        """Threads that share one row inside a block."""
        return self.threads // self.rows_per_block

    @classmethod
    def from_label(cls, label: str) -> KernelConfig:
        """Parse :meth:`label` output back into a configuration.

        Raises:
            ValueError: ``label`` is not a label of this form.
        """
        match = _LABEL.fullmatch(label)
        if match is None:
            raise ValueError(f"not a kernel label: {label!r} (e.g. t256v8r1-smem-two_pass-c1-p0)")
        t, v, r, cache, stats, c, p, s, k, m = match.groups()
        return cls(int(t), int(v), int(r), cache, stats, int(c), int(p), int(s or 0), int(m or 0),
                   bool(k))

    def label(self) -> str:
        """Return a short human-readable name, e.g. ``t256v8r1-registers-welford-c1-p0``.

        Bulk configs end in their stages (``-s2``) and, keeping x in L2, ``-k``; capped ones in
        their registers (``-m64``).
        """
        label = (
            f"t{self.threads}v{self.vec}r{self.rows_per_block}-{self.cache}-{self.stats}"
            f"-c{self.cluster}-p{self.blocks_per_sm}"
        )
        if self.stages:
            label += f"-s{self.stages}"
        if self.keep_x:
            label += "-k"
        return f"{label}-m{self.max_regs}" if self.max_regs else label


@dataclass(frozen=True)
class Shape:
    """Derived per-thread work of a configuration on a problem (what the template unrolls)."""

    segment: int  # elements of a row that one block handles (hidden / cluster)
    threads_per_row: int
    iters: int  # vector accesses per thread per row
    cache_regs: int  # 32-bit registers a thread spends on a register row cache
    smem_cache_bytes: int  # bytes of shared memory for a shared-memory row cache
    vec: int  # elements per vector access

    @property
    def even(self) -> bool:
        """True when the vectors tile the segment exactly (no tail guard needed)."""
        return self.segment == self.iters * self.threads_per_row * self.vec


def derive_shape(config: KernelConfig, problem: Problem) -> Shape:
    """Compute the per-thread work of ``config`` on ``problem`` (no validity checks)."""
    segment = problem.hidden // max(config.cluster, 1)
    tpr = max(config.threads // max(config.rows_per_block, 1), 1)
    vectors = math.ceil(segment / config.vec)
    iters = math.ceil(vectors / tpr)
    vec_bytes = config.vec * problem.itemsize
    cache_regs = iters * math.ceil(vec_bytes / 4)
    smem = config.rows_per_block * segment * problem.itemsize
    return Shape(segment, tpr, iters, cache_regs, smem, config.vec)


# A shared-memory row cache is filled by cp.async (LDGSTS, compute capability 8.0+) when a thread
# copies more than this many vectors per row: the plain fill stages them through registers four
# at a time (``#pragma unroll 4``), so longer rows wait for several round trips, while cp.async
# puts every copy in flight at once. A/B on the H200 (NOTES.md 39): x1.02-1.08 on 16-bit smem
# kernels of 6-8 vectors per thread (bf16 12288 t256v8r1 85.7% -> 88.3% of copy, 16384 85.3% ->
# 86.9%), fp32 8192 t256v4r1 x1.047; at 4 vectors or fewer x0.986-1.009 (the winners at 768-8192
# among them), so those keep the plain fill.
ASYNC_FILL_ITERS = 4


def fills_async(config: KernelConfig, problem: Problem, device: DeviceLimits = H200) -> bool:
    """Whether a shared-memory row cache is filled by cp.async instead of through registers."""
    return (
        config.cache == "smem" and device.cc >= 80
        # cp.async copies 4, 8 or 16 bytes: not one 16-bit element
        and config.vec * problem.itemsize >= 4
        and derive_shape(config, problem).iters > ASYNC_FILL_ITERS
    )


def smem_bytes(config: KernelConfig, problem: Problem) -> int:
    """Dynamic shared memory a launch of ``config`` needs, in bytes."""
    if config.cache == "bulk":
        stages = max(config.stages, 1)
        return bulk_stage_bytes(config, problem) + bulk_scratch_bytes(
            stages, config.rows_per_block, config.cluster)
    shape = derive_shape(config, problem)
    cache = shape.smem_cache_bytes if config.cache == "smem" else 0
    return cache + SCRATCH_SMEM


def bulk_stage_bytes(config: KernelConfig, problem: Problem) -> int:
    """Shared memory of the bulk-copy kernel's stages: stages x rows per tile x segment bytes."""
    return max(config.stages, 1) * derive_shape(config, problem).smem_cache_bytes


def prefetches(config: KernelConfig) -> bool:
    """True when the kernel loads the next row while it finishes this one.

    A persistent grid (blocks_per_sm > 0) with a register cache holds two rows per thread: the
    one being normalized and the next one, whose loads are in flight meanwhile.
    """
    return config.cache == "registers" and config.blocks_per_sm > 0


def bulk_occupancy(
    config: KernelConfig, problem: Problem, device: DeviceLimits = H200
) -> tuple[int, bool]:
    """Blocks per SM the bulk-copy kernel is built for, and whether it holds weights in registers.

    Shared memory (the stages) and threads decide how many blocks fit an SM, and the kernel's
    register need may allow fewer; the ``__launch_bounds__`` minimum is the count reached. Weight
    and bias stay in registers (4 per 16-byte vector each) when that costs no block of it.
    """
    smem = smem_bytes(config, problem)
    by_smem = device.smem_per_sm // (smem + 1024)  # the driver reserves 1 KB per block
    by_threads = device.max_threads_per_sm // config.threads
    target = max(1, min(by_smem, by_threads, 32))
    shape = derive_shape(config, problem)
    iters = shape.iters
    # Unrolled loops keep about a vector's four registers per vector in flight; ragged tails
    # keep masks and indices live.
    base = BULK_OTHER_REGS + 4 * iters + (8 if config.cluster > 1 else 0)
    if not shape.even:
        base += 8
    affine = int(problem.has_weight) + int(problem.has_bias)
    # With weights in registers ptxas unrolls less: 512 threads, 8 vectors of weight and bias
    # and a cluster of 2 fit 128 registers without spills (lab sweep), so the weights replace
    # the in-flight term rather than add to it.
    with_weights = base - 4 * iters + 4 * iters * affine
    if config.rows_per_block > 1:  # 2048, 4-16 rows of a warp, 8 vectors: 16-104 B spilled
        with_weights += 32

    def fits(need: int, blocks: int) -> bool:
        # 8 registers of margin, allocation in units of 8, and registers split per scheduler
        # quarter of the SM (as in min_blocks_per_sm): at the bare estimate 32-72-register
        # caps spilled 4-28 bytes (nvcc 13.0 sweeps of bulk kernels, 2026-11-29).
        need = -(-(need + 8) // 8) * 8
        warps = max(1, config.threads // 32)
        per_quarter = -(-(warps * blocks) // 4)
        return need <= 255 and per_quarter * 32 * need <= device.regs_per_sm // 4

    # The blocks the kernel's own registers allow, then weights in registers if they fit there.
    # Deciding the weights at the target instead (shared memory's count, which the registers may
    # not reach) ran t256 c2 s2 at bf16 32768 with 2 blocks and its weights read from L1 every
    # row: x0.984 of the same kernel with them in registers; t256 c4 s2 at bf16 65536 x0.956
    # (H200, single launches; NOTES.md 77).
    blocks = target
    while blocks > 1 and not fits(base, blocks):
        blocks -= 1
    wreg = affine > 0 and iters <= BULK_MAX_WEIGHT_ITERS and fits(with_weights, blocks)
    return blocks, wreg


def register_estimate(config: KernelConfig, problem: Problem) -> int:
    """Registers per thread a configuration needs, estimated (an upper bound in practice).

    The rest of the kernel needs about OTHER_REGS; a register row cache adds its elements as
    fp32 values (the compiler converts early), Welford's running triplets and divides about half
    as much again, and a cluster's extra reductions 16. Fitted to the nvcc 13.0 sm_90 sweep of
    2026-11-29 (420 kernels): every register-cache kernel admitted compiled without spills.
    """
    need = OTHER_REGS + (16 if config.cluster > 1 else 0)
    per_elem = 1.5 if config.stats == "welford" else 1.25
    if config.cache == "registers":
        elems = derive_shape(config, problem).iters * config.vec
        if prefetches(config):
            elems *= 2  # the next row is held too
    else:
        elems = 4 * config.vec  # the loops are unrolled 4 vectors deep
    return need + int(elems * per_elem)


def min_blocks_per_sm(config: KernelConfig, problem: Problem, device: DeviceLimits = H200) -> int:
    """The ``__launch_bounds__`` minimum blocks per SM: as many as the register estimate allows.

    Without it ptxas guessed: at 512 threads it capped a kernel at 32 registers and spilled 4 KB;
    with a minimum of 1 it gave a 128-thread kernel 128 registers, so only 4 blocks fit an SM and
    it ran at 75% instead of ~85% of copy bandwidth (H200, bf16 4096, 2026-11-29).
    """
    if config.cache == "bulk":
        return bulk_occupancy(config, problem, device)[0]
    # 32 registers of margin: with 0 or 16 ptxas still spilled some (420-kernel sweeps).
    need = -(-register_estimate(config, problem) // 8) * 8 + 32
    # Registers are allocated per warp-scheduler quarter of the SM (regs_per_sm / 4 each), so
    # count warps per quarter: with one-warp blocks the whole-SM division promised ~100
    # registers where ptxas could give 96 and spilled (fp32 sweep of 9,156 kernels).
    warps = max(1, config.threads // 32)
    warps_per_quarter = (device.regs_per_sm // 4) // (32 * need)
    by_regs = (4 * warps_per_quarter) // warps
    return max(_resident(by_regs, config, device), capped_blocks(config, device))


def _resident(blocks: int, config: KernelConfig, device: DeviceLimits) -> int:
    """``blocks`` per SM within what the SM holds: its threads, 32 blocks, and at least 1."""
    return max(1, min(blocks, device.max_threads_per_sm // config.threads, 32))


def capped_blocks(config: KernelConfig, device: DeviceLimits = H200) -> int:
    """Blocks per SM that hold a thread to ``config.max_regs`` registers (0 when uncapped).

    ``__launch_bounds__(threads, k)`` makes ptxas fit k blocks in the SM's registers, so k =
    regs_per_sm / (threads x max_regs) caps a thread at max_regs.
    """
    if not config.max_regs:
        return 0
    return _resident(device.regs_per_sm // (config.threads * config.max_regs), config, device)


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


def iter_space() -> Iterator[KernelConfig]:
    """Yield every point of the raw space (valid or not), in a fixed order.

    Stages belong to the bulk-copy kernel, which takes two-pass statistics, an occupancy-sized
    grid and no register cap only: its other combinations are left out rather than checked.
    """
    for t, v, r, c, s, cl, p, keep in itertools.product(
        THREADS, VECS, ROWS_PER_BLOCK, CACHES, STATS, CLUSTERS, BLOCKS_PER_SM, (False, True)
    ):
        if c != "bulk":
            for m in MAX_REGS:
                yield KernelConfig(t, v, r, c, s, cl, p, 0, m, keep_x=keep)
        elif s == "two_pass" and p == 0:
            for st in STAGES[1:]:
                yield KernelConfig(t, v, r, c, s, cl, p, st, keep_x=keep)


def enumerate_space(problem: Problem, device: DeviceLimits = H200) -> list[KernelConfig]:
    """Return every valid configuration for ``problem`` on ``device``, in a fixed order."""
    return [c for c in iter_space() if not check(c, problem, device)]


def default_config(problem: Problem, device: DeviceLimits = H200) -> KernelConfig:
    """Return a sound configuration for any hidden size, without tuning.

    Aims at about four 16-byte vectors per thread: the measured sweet spot of the untuned
    kernel (shared/device/README.md, 2026-11-29), and a register cache where it fits; in 16-bit
    under the 64-register cap (see ``_capped_default``).
    """
    vec = problem.max_vec
    vectors = math.ceil(problem.hidden / vec)
    tpr = min(1024, max(1, 1 << math.ceil(math.log2(max(1, math.ceil(vectors / 4))))))
    rows = min(32, max(1, 128 // tpr))
    threads = tpr * rows
    for cache, stats in (("registers", "two_pass"), ("smem", "two_pass")):
        cfg = KernelConfig(threads, vec, rows, cache, stats, 1, 0)
        if not check(cfg, problem, device):
            return _capped_default(cfg, problem, device)
    # Rows past one block's shared memory: split across a cluster (Hopper) and keep the two-pass
    # statistics (Welford without a cache re-reads x from global memory to normalize).
    for cluster in CLUSTERS[1:]:
        cfg = KernelConfig(1024, vec, 1, "smem", "two_pass", cluster, 0)
        if not check(cfg, problem, device):
            return cfg
    cfg = KernelConfig(threads, vec, rows, "none", "welford", 1, 0)
    if not check(cfg, problem, device):
        return cfg
    # Very long rows: welford without a cache fits in one block up to its run cap (fp32: 2048
    # elements per thread, WELFORD_RUN_MAX); past it split the row across a cluster, of 512-thread
    # blocks where 1024 would spill, with narrower vectors where the widest do not divide.
    for vec_try in (v for v in VECS[::-1] if v <= vec):
        for cluster in CLUSTERS:
            for threads in (1024, 512):
                cfg = KernelConfig(threads, vec_try, 1, "none", "welford", cluster, 0)
                if not check(cfg, problem, device):
                    return cfg
    cap = welford_run_cap(problem)
    raise ConfigError(
        f"unsupported hidden size {problem.hidden} ({problem.dtype}): no configuration can run it "
        f"on {device.name}: a {problem.dtype} Welford run is at most {cap:,} elements per "
        f"thread, so rows over {1024 * cap:,} elements need a thread-block cluster, which needs "
        f"the hidden size to be a multiple of the cluster size times the vector width"
    )


def _capped_default(config: KernelConfig, problem: Problem, device: DeviceLimits) -> KernelConfig:
    """Return the 16-bit default under the 64-register cap (fp32 stays as it is).

    Its register cache where the cap holds it, else the same shape with a shared-memory cache.
    On the H200 (2^26 elements, lab/default_cap_lab.py, NOTES.md 38) the capped default ran
    x1.04-x1.61 faster than the uncapped one at 10 of 12 bf16 hidden sizes from 768 to 16384
    (x1.31 at 8192, x1.61 at 11008) and alike in fp16; at 1536 and 2048 (two rows of 64 threads
    a block) it ran x0.975 and x0.931.
    """
    if problem.itemsize != 2:
        return config
    for candidate in (
        dataclasses.replace(config, max_regs=64),
        dataclasses.replace(config, cache="smem", max_regs=64),
    ):
        if not check(candidate, problem, device):
            return candidate
    return config


def seed_configs(
    problem: Problem, device: DeviceLimits = H200, rows: int | None = None
) -> list[KernelConfig]:
    """Return structured starting points for a search: the default and its neighbours.

    With a budget of a few dozen trials in a space of thousands, TPE alone often never meets
    the good region: a 14-trial bf16 grid tune on the H200 (2026-11-29) picked winners at
    56-73% of copy bandwidth where a hand sample had found 76-85% near the default. Seeding the
    study with the default's neighbourhood (threads per row x0.5/x1/x2; a register cache, a
    shared-memory cache, or a register cache in a persistent grid that prefetches the next row)
    gives the sampler that region first. The persistent seeds replaced Welford ones: Welford
    never won after its fp32 rebase (benchmarks/NOTES.md 26), while a persistent t512 register
    kernel, never seeded, beat the fp32 12288 winner by x1.040 (88.7% -> 92.3%, H200,
    2026-11-30, NOTES 29). In 16-bit the neighbours are capped at 64 registers where the cap
    applies: capped, the same configs ran x1.03-x1.32 faster in 13 of 15 pairs (NOTES 34).

    Args:
        problem: the hidden size, dtype and affine flags.
        device: the GPU's limits.
        rows: the row count tuned for; a few rows add :func:`latency_seed_configs`.
    """
    base = default_config(problem, device)
    tpr0 = base.threads_per_row
    seeds = [base]
    caps = (64, 0) if problem.itemsize == 2 else (0,)
    for tpr in (tpr0, tpr0 // 2, tpr0 * 2):
        for cache, blocks_per_sm in (("registers", 0), ("smem", 0), ("registers", 4)):
            per_block = max(1, min(32, 256 // max(tpr, 1)))
            threads = tpr * per_block
            if tpr < 1 or threads > 1024:
                continue
            add_first_valid(seeds, (
                KernelConfig(threads, base.vec, per_block, cache, "two_pass", 1, blocks_per_sm, 0,
                             m)
                for m in caps), problem, device)
    # One warp a block, one row a warp, the row in registers: torch.compile's kernel at 768-1024
    # (one-warp persistent reductions). The neighbours above keep 256-thread blocks, so the
    # search never met it; at fp32 1024 it ran x1.017 of the shipped t256v4r8 winner (99.9% of
    # copy) and at fp32 768 x1.008, in 16-bit x0.99-1.00 (H200, NOTES.md 102).
    add_first_valid(seeds, (KernelConfig(32, base.vec, 1, "registers", "two_pass", 1, 0, 0, m)
                            for m in caps), problem, device)
    seeds += [c for c in bulk_seed_configs(problem, device) if c not in seeds]
    if rows is None:
        return seeds
    # Right after the default: the bucket searches run 10 trials against 13-16 seeds, so seeds
    # at the end were never measured (call s24d: no rows-1/8 study reached them).
    latency = latency_seed_configs(problem, rows, device)
    return seeds[:1] + latency + [c for c in seeds[1:] if c not in latency]


def latency_seed_configs(
    problem: Problem, rows: int, device: DeviceLimits = H200
) -> list[KernelConfig]:
    """Starting points for a few rows: each row split over a cluster of 8 (then 4) small blocks.

    With fewer rows than SMs most SMs idle, and a row's time is one block's chain of load,
    reduce and store; split over 8 blocks of 128 threads (one stage: the row's slice loaded once
    by the bulk engine) each chain is an eighth as long. Head to head at hidden 16384 (H200,
    benchmarks/NOTES.md 114): rows 1 x1.017 (bf16), x1.063 (fp16), x1.170 (fp32) of the shipped
    winners; rows 8 x1.013 (fp16), x1.086 (fp32), bf16 x0.985; rows 64 x0.84-0.93, so the seeds
    stop where the blocks would outnumber the SMs. The bucket searches (22 trials in a space of
    thousands) never sampled them.

    Args:
        problem: the hidden size, dtype and affine flags.
        rows: the row count tuned for.
        device: the GPU's limits.
    """
    if device.cc < 90:
        return []
    vec = 16 // problem.itemsize
    seeds = []
    for cluster in (8, 4):
        cfg = KernelConfig(128, vec, 1, "bulk", "two_pass", cluster, 0, 1)
        if rows * cluster <= device.sm_count and not check(cfg, problem, device):
            seeds.append(cfg)
    return seeds


def add_first_valid(seeds: list[KernelConfig], candidates: Iterable[KernelConfig],
                    problem: Problem, device: DeviceLimits) -> None:
    """Append the first valid one of ``candidates`` to ``seeds``, unless it is there already.

    The candidates are one config under each register cap, in order of preference; nothing is
    appended if none is valid.
    """
    cfg = next((c for c in candidates if not check(c, problem, device)), None)
    if cfg is not None and cfg not in seeds:
        seeds.append(cfg)


MAX_BULK_SEEDS = 8


def bulk_seed_configs(problem: Problem, device: DeviceLimits = H200) -> list[KernelConfig]:
    """Starting points in the bulk-copy kernel's region: tiles of ~16-64 KB, 2-3 stages.

    The lab sweep (benchmarks/NOTES.md, 2026-11-29, ~3,000 kernels) found its winners there:
    256-512 threads, 2-4 stages, a cluster of 2 for bf16 65536 and fp32 32768, of 4 for fp32
    65536, rows of 16-32 KB alone and smaller rows grouped into tiles. They keep x in L2
    (``keep_x``: x1.02-1.05 at all nine bulk winners it was set against, NOTES.md 117).
    """
    if device.cc < 90:
        return []
    row_bytes = problem.hidden * problem.itemsize
    vec = 16 // problem.itemsize
    seeds: list[KernelConfig] = []
    # Rows of 16-32 KB: a row a tile at 8 vectors a thread, 64-96 KB of stages (t128 s4 at 16
    # KB, t256 s3 at 32 KB). Head to head on an H200 these beat the fwd kernel's winners at
    # fp32 4096 (x1.016), fp32 8192 (x1.019) and 16-bit 8192 (x1.022-1.025), and t256 s3 is the
    # 16-bit 16384 winner (NOTES.md 112, 124). The loop below tiles 16 KB rows two at a time, so
    # the search never met them there.
    if 16384 <= row_bytes <= 32768 and row_bytes & (row_bytes - 1) == 0:
        cfg = KernelConfig(row_bytes // 128, vec, 1, "bulk", "two_pass", 1, 0,
                           min(4, 98304 // row_bytes), keep_x=True)
        if not check(cfg, problem, device):
            seeds.append(cfg)
    for cluster in (1, 2, 4, 8):
        seg_bytes = row_bytes // cluster
        if cluster > 1 and seg_bytes < 16384:
            continue
        rows = 1
        if cluster == 1:
            rows = max(1, min(16, 2 ** int(math.log2(max(1, 32768 // seg_bytes)))))
        # 256 before 1024: two 256-thread blocks an SM overlap one block's row sums and exchange
        # with the other's passes (t256 c4 at bf16 65536 x1.013-1.018 of the t512 c2 winner,
        # fp32 32768 x1.010; NOTES.md 77), and the cap of MAX_BULK_SEEDS cut them off.
        for threads in (512, 256, 1024):
            for stages in (2, 3):
                cfg = KernelConfig(threads, vec, rows, "bulk", "two_pass", cluster, 0, stages,
                                   keep_x=True)
                if cfg not in seeds and not check(cfg, problem, device):
                    seeds.append(cfg)
    return seeds[:MAX_BULK_SEEDS]


def rows_bucket(rows: int) -> int:
    """Return the power-of-two bucket of a row count (1, 2, 4, ...; rows=0 maps to 1)."""
    if rows <= 1:
        return 1
    return 1 << (rows - 1).bit_length()
