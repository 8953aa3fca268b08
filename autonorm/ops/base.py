"""The kernel-family seam: what a family provides, and what the generic layers may ask of it.

A kernel family is one operation (LayerNorm forward, say) with its own problem, configuration,
search space, templates, float64 reference and verification cases. The runtime, the tuner, the
tuning database, dispatch, export, the CLI and the torch layer know a family only through
:class:`Family` and find it by its op name in :mod:`autonorm.ops.registry`.

Pure logic: no CuPy, no GPU.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

if TYPE_CHECKING:
    from autonorm.codegen.kernel import RenderedKernel
    from autonorm.runtime.abi import KernelABI
    from autonorm.runtime.limits import DeviceLimits
    from autonorm.tune.evaluator import Workload


@runtime_checkable
class Problem(Protocol):
    """What a family computes for one shape: frozen, hashable, comparable.

    Every problem has a dtype and a hidden size (the length of the rows it works on); the rest
    of its fields are the family's own.
    """

    op: ClassVar[str]
    dtype: str
    hidden: int

    def fields(self) -> dict[str, Any]:
        """Return every field that identifies the problem, as JSON values (no ``op``)."""
        ...

    def describe(self) -> str:
        """Return a short human-readable description (``bfloat16 hidden 4096, weight, bias``)."""
        ...


@runtime_checkable
class Config(Protocol):
    """One point of a family's search space: a frozen dataclass."""

    def to_dict(self) -> dict[str, Any]:
        """Return the configuration as plain JSON values (for Optuna and the tuning DB)."""
        ...

    def label(self) -> str:
        """Return a short readable name of the configuration."""
        ...


@runtime_checkable
class Family(Protocol):
    """A kernel family, as the generic layers see it.

    Attributes:
        op: the family's name, e.g. ``"layer_norm"``: the DB key's op column, the CLI's
            ``--op`` value and the registry's key.
        template_dir: the folder of the family's Jinja templates.

    Optional members, looked up with ``getattr`` by the generic layers:
        legacy_versions: a frozenset of the version strings (package version and template
            hash) of autonorm releases older than kernel digests whose kernels the family
            renders unchanged today; lookup trusts winners migrated from those versions.
            Absent: no migrated winner is trusted.
        export_basename, export_files, export_manifest: the hooks of :class:`Exporter`;
            absent, an export writes the kernel source and a manifest only.
        neighbour_distance(problem, other): how far the winners of ``other``, another problem
            of the family, are from ``problem``, in octaves (lookup adds the octaves between
            rows buckets), or None where they may not lend their configuration to it. Lookup
            carries the nearest winner over that the family's rules accept for ``problem``.
            Absent: no problem lends to another.
        leaner(config, problem, device): forms of ``config`` that give each thread more
            registers or fewer values to hold, the nearest first (a list, perhaps empty, of
            configurations that the family's rules may still refuse); :mod:`autonorm.fallback`
            tries them first where ``config``, a default, spills on the GPU. Absent: only the
            default rule for a smaller register file is tried.
    """

    op: str
    template_dir: Path

    def problem(self, **fields: Any) -> Problem:
        """Build a problem from :meth:`Problem.fields` output (raises ``ValueError`` if bad)."""
        ...

    def config_from_dict(self, data: dict[str, Any]) -> Config:
        """Build a configuration from :meth:`Config.to_dict` output or a trial's parameters."""
        ...

    def suggest(self, trial: Any) -> Config:
        """Ask an Optuna trial for one point of the space (parameters named as the fields)."""
        ...

    def check(self, config: Config, problem: Problem, device: DeviceLimits) -> list[str]:
        """Return why ``config`` cannot run ``problem`` on ``device`` (empty when it can)."""
        ...

    def space(self, problem: Problem, device: DeviceLimits) -> Sequence[Config]:
        """Return every valid configuration for ``problem``, in a fixed order."""
        ...

    def default(self, problem: Problem, device: DeviceLimits, rows: int | None = None) -> Config:
        """Return a sound configuration without tuning (raises ``ConfigError`` if none).

        ``rows`` is the row count of the launch, when known: a family may pick by it.
        """
        ...

    def seeds(self, problem: Problem, device: DeviceLimits, rows: int | None) -> list[Config]:
        """Return starting points of a search, the default first."""
        ...

    def render(self, config: Config, problem: Problem, device: DeviceLimits) -> RenderedKernel:
        """Render the kernel's source and launch plan (raises ``ConfigError`` if invalid)."""
        ...

    def code_version(self) -> str:
        """Return a version of the family's templates (names the studies of a search)."""
        ...

    def bytes_moved(self, problem: Problem, rows: int) -> int:
        """Return the fewest bytes a launch over ``rows`` rows must read and write."""
        ...

    def kernel_abi(self, kernel: RenderedKernel) -> KernelABI:
        """Return the parameter list of a rendered kernel (how the runtime packs a launch)."""
        ...

    def workload(
        self, problem: Problem, rows: int, *, device_id: int = 0, seed: int = 0
    ) -> Workload:
        """Allocate the GPU inputs that time and verify the family's kernels over ``rows`` rows.

        The returned :class:`~autonorm.tune.evaluator.Workload` is what the GPU evaluator
        launches (rotated input sets), verifies against the float64 reference and divides the
        time into (bytes moved). Imports CuPy; called only where a GPU is.
        """
        ...


@runtime_checkable
class Exporter(Protocol):
    """The optional export hooks of a family: its host launcher and the files it comes in.

    :mod:`autonorm.export` renders the kernel, asks these hooks for the family's own files and
    manifest entries, and adds the manifest.
    """

    def export_basename(self, problem: Problem) -> str:
        """Return the default file stem (and launcher prefix) of an export, a C identifier."""
        ...

    def export_files(self, kernel: RenderedKernel, basename: str) -> dict[str, str]:
        """Return the files of an export by name, ``<basename>.cu`` first (no manifest)."""
        ...

    def export_manifest(self, kernel: RenderedKernel, basename: str) -> dict[str, Any]:
        """Return the family's manifest entries (``files`` and ``launch`` replace export's)."""
        ...


def problem_key(problem: Problem) -> str:
    """Return the canonical JSON text of a problem's fields (the tuning DB's problem column)."""
    return json.dumps(problem.fields(), sort_keys=True, separators=(",", ":"))


def rows_bucket(rows: int) -> int:
    """Return the power-of-two bucket of a row count (1, 2, 4, ...; rows=0 maps to 1)."""
    if rows <= 1:
        return 1
    return 1 << (rows - 1).bit_length()


def domain_reasons(config: Any, domains: dict[str, Sequence[Any]]) -> list[str]:
    """Return why fields of ``config`` lie outside their domains, in the order of ``domains``.

    Each reason reads ``"<field> must be one of <domain>"``; a family's rules start from these.
    """
    return [f"{name} must be one of {domain}" for name, domain in domains.items()
            if getattr(config, name) not in domain]
