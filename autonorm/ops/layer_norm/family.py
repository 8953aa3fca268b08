"""LayerNorm forward as a kernel family (:class:`autonorm.ops.base.Family`)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from autonorm.ops.layer_norm import codegen, rules, space
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
    takes_early,
)
from autonorm.ops.layer_norm.problem import Problem
from autonorm.runtime.abi import KernelABI
from autonorm.runtime.limits import DeviceLimits

# Every LayerNorm kernel, row or bulk, takes x, weight, bias, y (pointers, 0 for an absent
# weight or bias), rows (int), eps (float), then the bulk kernel's tile counter, which the row
# kernels never read: one list, so a launch never asks which kernel it has.
KERNEL_ABI = KernelABI("QQQQif", rows_index=4, workspace=True)

# The residual add's kernels (any norm of the row kernels) take x, residual, weight, bias, y, h,
# rows, eps, then the workspace.
RESIDUAL_ABI = KernelABI("QQQQQQif", rows_index=6, workspace=True)

# A winner lends its configuration to hidden sizes less than this factor from its own (lookup's
# neighbour step): a size between two tuned ones at most 2x apart is within sqrt(2) of one. A
# winner carried twice as far gives each thread twice its tuned work (past the bulk kernel's 8
# vectors where it had 8), where the untuned default rescales its threads to the row.
NEIGHBOUR_MAX_RATIO = 2.0


def hidden_octaves(problem: Problem, other: Problem) -> float | None:
    """Return how many octaves apart two hidden sizes are, or None where no winner may lend.

    Sizes 2x apart or more do not lend (:data:`NEIGHBOUR_MAX_RATIO`), nor do a size on the
    16-byte vector grid and one off it: off the grid the same configuration runs the skewed
    paths (docs/kernels.md), another kernel than the one that was timed. On the H200, at the
    shapes nobody tuned, an aligned size's winner carried to 26531 ran 0.67-0.78x the default's
    speed (fp32 at 2^26 elements, 16-bit and fp32 at one row), while among sizes on the grid the
    carried winners ran 0.92-1.17x, 1.00x by geometric mean (docs/tuning.md, lookup).
    """
    if problem.on_vector_grid != other.on_vector_grid:
        return None
    distance = abs(math.log2(other.hidden) - math.log2(problem.hidden))
    return distance if distance < math.log2(NEIGHBOUR_MAX_RATIO) else None


class LayerNormFamily:
    """``y = (x - mean) / sqrt(var + eps) * weight + bias`` over each row."""

    op = "layer_norm"
    template_dir = codegen.TEMPLATE_DIR
    problem_type = Problem
    config_type = KernelConfig
    # Versions of autonorm before winners recorded their kernel's digest whose kernels this
    # code renders unchanged (code without comments, every shipped winner checked by
    # tests/test_shipped_kernels.py): their migrated winners stay in use.
    legacy_versions = frozenset({"0.1.0+96473fff10af"})

    def problem(self, **fields: Any) -> Problem:
        """Build a problem from its fields (hidden, dtype, has_weight, has_bias, residual)."""
        return Problem(**fields)

    def config_from_dict(self, data: dict[str, Any]) -> KernelConfig:
        """Build a configuration from a dict (unknown keys ignored)."""
        return KernelConfig.from_dict(data)

    def suggest(self, trial: Any) -> KernelConfig:
        """Ask ``trial`` for one point of the template family (parameters named as the fields).

        The bulk-copy kernel fixes its statistics (two-pass), grid and registers (occupancy)
        and alone takes ``stages``: those parameters are asked conditionally, so no ask is spent
        on combinations that cannot exist.
        """
        threads = trial.suggest_categorical("threads", THREADS)
        vec = trial.suggest_categorical("vec", VECS)
        rows_per_block = trial.suggest_categorical("rows_per_block", ROWS_PER_BLOCK)
        cache = trial.suggest_categorical("cache", CACHES)
        cluster = trial.suggest_categorical("cluster", CLUSTERS)
        keep_x = trial.suggest_categorical("keep_x", (False, True))
        if cache == "bulk":
            stages = trial.suggest_categorical("stages", STAGES[1:])
            return KernelConfig(
                threads=threads, vec=vec, rows_per_block=rows_per_block, cache=cache,
                cluster=cluster, stages=stages, keep_x=keep_x,
                **BULK_FIXED,  # type: ignore[arg-type]
            )
        stats = trial.suggest_categorical("stats", STATS)
        blocks_per_sm = trial.suggest_categorical("blocks_per_sm", BLOCKS_PER_SM)
        max_regs = trial.suggest_categorical("max_regs", MAX_REGS)
        early = takes_early(cache, cluster, blocks_per_sm, max_regs) and (
            trial.suggest_categorical("early", (False, True)))
        return KernelConfig(
            threads=threads,
            vec=vec,
            rows_per_block=rows_per_block,
            cache=cache,
            stats=stats,
            cluster=cluster,
            blocks_per_sm=blocks_per_sm,
            max_regs=max_regs,
            keep_x=keep_x,
            early=early,
        )

    def check(self, config: KernelConfig, problem: Problem, device: DeviceLimits) -> list[str]:
        """Return why ``config`` cannot run ``problem`` on ``device``."""
        return rules.check(config, problem, device)

    def space(self, problem: Problem, device: DeviceLimits) -> list[KernelConfig]:
        """Return every valid configuration, in a fixed order."""
        return space.enumerate_space(problem, device)

    def default(
        self, problem: Problem, device: DeviceLimits, rows: int | None = None
    ) -> KernelConfig:
        """Return the untuned default configuration for ``rows`` rows (:mod:`.heuristic`)."""
        return space.default_config(problem, device, rows)

    def leaner(
        self, config: KernelConfig, problem: Problem, device: DeviceLimits
    ) -> list[KernelConfig]:
        """Return forms of ``config`` that give each thread more registers or less to hold.

        The register cap (``max_regs``) lifted: it is fitted to sm_90's ptxas, and compiled
        for sm_100 and sm_120 the capped smem kernels of 16-bit rows of 512-2048 spill 4-32
        bytes under it and fit without. A bulk kernel with more stages: shared memory then
        holds fewer blocks an SM, and ``__launch_bounds__`` gives each thread more registers
        (16-bit LayerNorm's bulk kernels at 16384-65536 spilled 100-112 bytes at 128 registers
        on sm_100, and after the add 4 bytes at 168 on sm_90; a stage or two more fit them).
        Then a bulk kernel's row split over a larger cluster, each thread holding fewer of its
        vectors: at 512 threads a thread may have no more than 128 registers whatever the
        stages, and 16-bit rows of 32768 spill there on sm_100 and sm_120 but fit over a
        cluster of 2. The family's rules are left to refuse what does not run
        (:mod:`autonorm.fallback`).
        """
        del problem, device  # the rules judge each form where it is used
        forms = []
        if config.max_regs:
            forms.append(dataclasses.replace(config, max_regs=0))
        if config.cache == "bulk":
            forms += [dataclasses.replace(config, stages=stages) for stages in STAGES
                      if stages > config.stages]
            forms += [dataclasses.replace(config, cluster=cluster) for cluster in CLUSTERS
                      if cluster > config.cluster]
        return forms

    def neighbour_distance(self, problem: Problem, other: Problem) -> float | None:
        """Return how far ``other``'s winners are from ``problem``, or None if they may not lend.

        Problems of the same dtype, affine flags and residual add (which moves twice the bytes,
        through other caches) lend their winners across hidden sizes less than
        :data:`NEIGHBOUR_MAX_RATIO` apart, both on the vector grid or both off it
        (:func:`hidden_octaves`); the distance is the ratio's log2 (octaves).
        """
        same = (problem.dtype, problem.has_weight, problem.has_bias, problem.residual,
                problem.residual_dtype)
        if (other.dtype, other.has_weight, other.has_bias, other.residual,
                other.residual_dtype) != same:
            return None
        return hidden_octaves(problem, other)

    def seeds(
        self, problem: Problem, device: DeviceLimits, rows: int | None = None
    ) -> list[KernelConfig]:
        """Return the search's starting points, the default first."""
        return space.seed_configs(problem, device, rows)

    def render(self, config: KernelConfig, problem: Problem, device: DeviceLimits) -> Any:
        """Render the kernel (a :class:`autonorm.codegen.kernel.RenderedKernel`)."""
        return codegen.render(config, problem, device)

    def code_version(self) -> str:
        """Return the package version and a hash of the family's templates."""
        return codegen.code_version()

    def bytes_moved(self, problem: Problem, rows: int) -> int:
        """Return the fewest bytes a launch moves.

        x is read and y written once (with the residual add, the residual read and h written
        once too, in h's dtype), and weight and bias read once.
        """
        affine = int(problem.has_weight) + int(problem.has_bias)
        return rows * problem.row_io_bytes + affine * problem.hidden * problem.itemsize

    def kernel_abi(self, kernel: Any) -> KernelABI:
        """Return ``kernel``'s parameters: :data:`RESIDUAL_ABI` with the residual add, else ours."""
        return RESIDUAL_ABI if kernel.problem.residual else KERNEL_ABI

    def workload(self, problem: Problem, rows: int, *, device_id: int = 0, seed: int = 0) -> Any:
        """Allocate rotated inputs, weight, bias and a tile counter (:mod:`.workload`)."""
        from autonorm.ops.layer_norm.workload import LayerNormWorkload

        return LayerNormWorkload(
            problem, rows, nbytes=self.bytes_moved(problem, rows), device_id=device_id, seed=seed
        )

    def export_basename(self, problem: Problem) -> str:
        """Return the default file stem of an export, e.g. ``autonorm_ln_bf16_h16384``."""
        from autonorm.ops.layer_norm import launcher

        return launcher.default_basename(problem)

    def export_files(self, kernel: Any, basename: str) -> dict[str, str]:
        """Return the exported ``.cu`` (kernel and host launcher) and ``.h``, by file name."""
        from autonorm.ops.layer_norm import launcher

        return launcher.launcher_files(kernel, basename)

    def min_compute_capability(self, kernel: Any, device: DeviceLimits) -> int:
        """Return the oldest compute capability that runs ``kernel``, rendered for ``device``.

        Thread-block clusters and the bulk-copy engine (``cp.async.bulk``, mbarrier
        transactions) need 9.0; L2 cache policies (``createpolicy``, keep_x) and ``cp.async``
        fills need 8.0; other kernels build for 7.5, the oldest architecture of nvcc 13.
        """
        from autonorm.ops.layer_norm.plan import derive_plan

        config = kernel.config
        if config.cache == "bulk" or config.cluster > 1:
            return 90
        if config.keep_x or derive_plan(config, kernel.problem, device).async_fill:
            return 80
        return 75

    def export_manifest(self, kernel: Any, basename: str) -> dict[str, Any]:
        """Return the manifest entries of the launcher (functions, files, launch plan)."""
        from autonorm.ops.layer_norm import launcher

        return launcher.manifest_entries(kernel, basename)


FAMILY = LayerNormFamily()
