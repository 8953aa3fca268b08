"""The files of an export: the kernel's source, the family's launcher files and a manifest.

Any family exports: its kernel is rendered as at run time, and written as ``<basename>.cu``
with a ``<basename>.json`` manifest that says what it is (problem, configuration, kernel name,
launch plan, target architecture and the oldest compute capability that runs it, device limits,
metrics, provenance). A family with export hooks
(:class:`autonorm.ops.base.Exporter`, e.g. LayerNorm's host launcher) supplies its own files
and manifest entries instead of the bare kernel source.

:func:`render_export` is pure (text only, deterministic, no GPU); :func:`write_export` writes
it; :func:`export_kernel` does both for a given configuration.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autonorm.dtypes import SHORT_DTYPES
from autonorm.ops.base import Config, Problem
from autonorm.ops.registry import family_of
from autonorm.runtime.limits import H200, DeviceLimits

if TYPE_CHECKING:
    from autonorm.codegen.kernel import RenderedKernel

# Version of the manifest's layout, bumped when a key changes meaning or disappears.
MANIFEST_FORMAT = 1

# Manifest entries of a family's hook that replace export's own (at their place in the layout).
_REPLACEABLE = ("files", "launch")

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class ExportedKernel:
    """The rendered files of one export, not yet written.

    Attributes:
        basename: the file stem (and, for a family with a launcher, its prefix).
        sources: the files other than the manifest, by name, ``<basename>.cu`` first.
        manifest: content of ``<basename>.json``.
        kernel: the rendered kernel it holds.

    """

    basename: str
    sources: dict[str, str]
    manifest: dict[str, Any]
    kernel: RenderedKernel

    @property
    def source(self) -> str:
        """Text of ``<basename>.cu`` (the kernel, then the family's launcher if it has one)."""
        return self.sources[f"{self.basename}.cu"]

    @property
    def header(self) -> str | None:
        """Text of ``<basename>.h``, for a family whose launcher has one (else None)."""
        return self.sources.get(f"{self.basename}.h")

    @property
    def files(self) -> dict[str, str]:
        """File name -> text, in the order they are written (sources, then the manifest)."""
        manifest = json.dumps(self.manifest, indent=2, allow_nan=False) + "\n"
        return {**self.sources, f"{self.basename}.json": manifest}


def default_basename(problem: Problem) -> str:
    """Return the default file stem of ``problem``'s export.

    The family's ``export_basename`` hook names it (LayerNorm: ``autonorm_ln_bf16_h16384``);
    otherwise it is ``autonorm_<op>_<dtype>_h<hidden>``.
    """
    hook = getattr(family_of(problem), "export_basename", None)
    if hook is not None:
        return hook(problem)
    dtype = SHORT_DTYPES.get(problem.dtype, problem.dtype)
    return f"autonorm_{type(problem).op}_{dtype}_h{problem.hidden}"


def render_export(
    config: Config,
    problem: Problem,
    *,
    metrics: dict | None = None,
    device: DeviceLimits | None = None,
    basename: str | None = None,
    provenance: dict[str, Any] | None = None,
) -> ExportedKernel:
    """Render the files of an export (pure: no file is written, no GPU is needed).

    Args:
        config: the kernel configuration.
        problem: what the kernel computes.
        metrics: measured metrics to record in the manifest (median_us, gbps, share, ...).
        device: limits to validate and render for (an H200's when None).
        basename: the file stem, a C identifier (default :func:`default_basename`).
        provenance: extra manifest entries saying where the configuration came from (``source``,
            ``tuned_for``, ``notes``); default ``"source": "explicit"``, no ``tuned_for`` (null)
            and no notes.

    Raises:
        autonorm.errors.ConfigError: the configuration is invalid for the problem.
        ValueError: the basename is not a C identifier.

    """
    if basename is None:
        basename = default_basename(problem)
    if not _IDENTIFIER.fullmatch(basename):
        raise ValueError(f"basename must be a C identifier, got {basename!r}")
    family = family_of(problem)
    limits = device or H200
    kernel = family.render(config, problem, limits)
    files_hook = getattr(family, "export_files", None)
    sources = files_hook(kernel, basename) if files_hook else {f"{basename}.cu": kernel.source}
    manifest_hook = getattr(family, "export_manifest", None)
    entries = dict(manifest_hook(kernel, basename)) if manifest_hook else {}
    own = {name: entries.pop(name) for name in _REPLACEABLE if name in entries}
    manifest = {
        "format": MANIFEST_FORMAT,
        "autonorm_version": family.code_version(),
        "basename": basename,
        **entries,
        "files": own.get("files", {"source": f"{basename}.cu"}),
        "problem": problem.fields(),
        "config": config.to_dict(),
        "label": config.label(),
        "kernel_name": kernel.name,
        "launch": own.get("launch", dataclasses.asdict(kernel.launch)),
        "target": {
            "arch": limits.arch,
            "min_compute_capability": min_compute_capability(kernel, limits),
        },
        "device_limits": dataclasses.asdict(limits),
        "source": "explicit",
        "tuned_for": None,
        "notes": [],
        **(provenance or {}),
        "metrics": _jsonable(metrics) if metrics is not None else None,
    }
    return ExportedKernel(basename, sources, manifest, kernel)


def min_compute_capability(kernel: RenderedKernel, limits: DeviceLimits) -> int:
    """Return the oldest compute capability that runs ``kernel``, rendered for ``limits``.

    The family says (its ``min_compute_capability`` hook); a family without the hook is taken
    to need the architecture it was rendered for.
    """
    hook = getattr(family_of(kernel.problem), "min_compute_capability", None)
    return int(hook(kernel, limits)) if hook is not None else limits.cc


def write_export(exported: ExportedKernel, out_dir: Path) -> list[Path]:
    """Write ``exported``'s files into ``out_dir`` (created if missing); return their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in exported.files.items():
        path = out_dir / name
        path.write_text(text, encoding="utf-8", newline="\n")
        paths.append(path)
    return paths


def export_kernel(
    config: Config,
    problem: Problem,
    out_dir: Path,
    *,
    metrics: dict | None = None,
    device: DeviceLimits | None = None,
    basename: str | None = None,
) -> list[Path]:
    """Export ``config`` for ``problem`` into ``out_dir``: ``<basename>.cu``, ..., ``.json``.

    Args:
        config: the kernel configuration.
        problem: what the kernel computes.
        out_dir: the directory to write into (created if missing).
        metrics: measured metrics to record in the manifest.
        device: limits to validate and render for (an H200's when None).
        basename: file stem (default :func:`default_basename`).

    Returns:
        The paths written, the manifest last (LayerNorm: the .cu, the .h and the .json).

    Raises:
        autonorm.errors.ConfigError: the configuration is invalid for the problem.
        ValueError: the basename is not a C identifier.

    """
    exported = render_export(config, problem, metrics=metrics, device=device, basename=basename)
    return write_export(exported, out_dir)


def _jsonable(value: Any) -> Any:
    """Return ``value`` as plain JSON data: NumPy scalars unwrapped, non-finite floats None."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # NumPy scalar
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
