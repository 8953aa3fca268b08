"""The backward of LayerNorm and RMSNorm as kernel families (:class:`autonorm.ops.base.Family`).

One kernel template serves both norms; :data:`LAYER_NORM` and :data:`RMS_NORM` are the two
families, registered as ``layer_norm_backward`` and ``rms_norm_backward``.
"""

from __future__ import annotations

import math
from typing import Any

from autonorm.ops.norm_backward import codegen, plan, space
from autonorm.ops.norm_backward.config import (
    ACCS,
    BLOCKS_PER_SM,
    CACHES,
    CLUSTERS,
    GROUPS,
    LANES_MIN_THREADS,
    STAGES,
    THREADS,
    VECS,
    BackwardConfig,
)
from autonorm.ops.norm_backward.problem import (
    BackwardProblem,
    LayerNormBackward,
    RMSNormBackward,
)
from autonorm.runtime.abi import KernelABI
from autonorm.runtime.limits import DeviceLimits

# x, dy, weight, dx, dweight, dbias, partials, dh (pointers; 0 where absent), rows, eps, then
# the barrier's counter.
KERNEL_ABI = KernelABI("QQQQQQQQif", rows_index=8, workspace=True)

# Winners lend their configuration to hidden sizes less than this factor from their own.
NEIGHBOUR_MAX_RATIO = 2.0


class BackwardFamily:
    """dx, dweight and dbias of a norm, deterministic (``problem_type`` names which norm)."""

    template_dir = codegen.TEMPLATE_DIR
    config_type = BackwardConfig
    legacy_versions: frozenset[str] = frozenset()

    def __init__(self, problem_type: type[BackwardProblem]) -> None:
        self.problem_type = problem_type
        self.op = problem_type.op

    def problem(self, **fields: Any) -> BackwardProblem:
        """Build a problem from its fields."""
        return self.problem_type(**fields)

    def config_from_dict(self, data: dict[str, Any]) -> BackwardConfig:
        """Build a configuration from a dict (unknown keys ignored)."""
        return BackwardConfig.from_dict(data)

    def suggest(self, trial: Any) -> BackwardConfig:
        """Ask ``trial`` for one point of the space (parameters named as the fields)."""
        cache = trial.suggest_categorical("cache", CACHES)
        threads = trial.suggest_categorical("threads", THREADS)
        return BackwardConfig(
            threads=threads,
            vec=trial.suggest_categorical("vec", VECS),
            cache=cache,
            acc=trial.suggest_categorical("acc", ACCS),
            blocks_per_sm=trial.suggest_categorical("blocks_per_sm", BLOCKS_PER_SM),
            # Prefetch applies to a row in registers, stages to the bulk copy only: no ask is
            # spent on combinations that cannot exist.
            prefetch=(trial.suggest_categorical("prefetch", (False, True))
                      if cache == "registers" else False),
            stages=trial.suggest_categorical("stages", STAGES[1:]) if cache == "bulk" else 0,
            cluster=trial.suggest_categorical("cluster", CLUSTERS) if cache == "bulk" else 1,
            hold=(trial.suggest_categorical("hold", (False, True))
                  if cache == "bulk" else False),
            groups=trial.suggest_categorical("groups", GROUPS) if cache == "bulk" else 1,
            lanes=(trial.suggest_categorical("lanes", (False, True))
                   if threads >= LANES_MIN_THREADS else False),
        )

    def check(
        self, config: BackwardConfig, problem: BackwardProblem, device: DeviceLimits
    ) -> list[str]:
        """Return why ``config`` cannot run ``problem`` on ``device``."""
        return plan.check(config, problem, device)

    def space(self, problem: BackwardProblem, device: DeviceLimits) -> list[BackwardConfig]:
        """Return every valid configuration, in a fixed order."""
        return space.enumerate_space(problem, device)

    def default(
        self, problem: BackwardProblem, device: DeviceLimits, rows: int | None = None
    ) -> BackwardConfig:
        """Return the untuned default configuration."""
        return space.default_config(problem, device, rows)

    def seeds(
        self, problem: BackwardProblem, device: DeviceLimits, rows: int | None = None
    ) -> list[BackwardConfig]:
        """Return the search's starting points, the default first."""
        return space.seed_configs(problem, device, rows)

    def neighbour_distance(self, problem: BackwardProblem, other: BackwardProblem) -> float | None:
        """Return how far ``other``'s winners are from ``problem`` in octaves, or None.

        Problems of the same dtype and weight form lend across hidden sizes less than
        :data:`NEIGHBOUR_MAX_RATIO` apart.
        """
        mine = {k: v for k, v in problem.fields().items() if k != "hidden"}
        theirs = {k: v for k, v in other.fields().items() if k != "hidden"}
        if mine != theirs:
            return None
        distance = abs(math.log2(other.hidden) - math.log2(problem.hidden))
        return distance if distance < math.log2(NEIGHBOUR_MAX_RATIO) else None

    def render(
        self, config: BackwardConfig, problem: BackwardProblem, device: DeviceLimits
    ) -> Any:
        """Render the kernel (a :class:`autonorm.codegen.kernel.RenderedKernel`)."""
        return codegen.render(config, problem, device)

    def code_version(self) -> str:
        """Return the package version and a hash of the templates."""
        return codegen.code_version()

    def bytes_moved(self, problem: BackwardProblem, rows: int) -> int:
        """Return the fewest bytes a launch moves.

        x and dy are read and dx written once (and after a residual add the returned h's
        gradient read once), the weight read and each column sum written once (the partials
        are the kernel's own traffic, not what the problem must move).
        """
        vectors = (4 if problem.residual else 3) * rows + int(problem.has_weight) + problem.sums
        return vectors * problem.hidden * problem.itemsize

    def min_compute_capability(self, kernel: Any, device: DeviceLimits) -> int:
        """Return the oldest compute capability that runs ``kernel``.

        The bulk-copy stages (``cp.async.bulk``, mbarrier transactions) need 9.0; the other
        kernels build for 7.5, the oldest architecture of nvcc 13 (the grid barrier needs only
        sm_70's ``ld.acquire`` and ``__nanosleep``).
        """
        return 90 if kernel.config.cache == "bulk" else 75

    def kernel_abi(self, kernel: Any) -> KernelABI:
        """Return the parameter list of every backward kernel."""
        return KERNEL_ABI

    def export_basename(self, problem: BackwardProblem) -> str:
        """Return the default file stem of an export, e.g. ``autonorm_ln_bwd_bf16_h16384``."""
        from autonorm.ops.norm_backward import launcher

        return launcher.default_basename(problem)

    def export_files(self, kernel: Any, basename: str) -> dict[str, str]:
        """Return the exported ``.cu`` (kernel and host launcher) and ``.h``, by file name."""
        from autonorm.ops.norm_backward import launcher

        return launcher.launcher_files(kernel, basename)

    def export_manifest(self, kernel: Any, basename: str) -> dict[str, Any]:
        """Return the manifest entries of the launcher, and ``how_to_launch`` the kernel alone."""
        from autonorm.ops.norm_backward import launcher
        from autonorm.ops.norm_backward.contract import how_to_launch

        entries = launcher.manifest_entries(basename, kernel.problem)
        return {**entries, "how_to_launch": how_to_launch(kernel.problem, kernel.launch,
                                                          entries["function"])}

    def workload(
        self, problem: BackwardProblem, rows: int, *, device_id: int = 0, seed: int = 0
    ) -> Any:
        """Allocate rotated inputs, outputs, partials and a counter (:mod:`.workload`)."""
        from autonorm.ops.norm_backward.workload import BackwardWorkload

        return BackwardWorkload(problem, rows, nbytes=self.bytes_moved(problem, rows),
                                device_id=device_id, seed=seed)


LAYER_NORM = BackwardFamily(LayerNormBackward)
RMS_NORM = BackwardFamily(RMSNormBackward)
