"""Export a kernel as standalone CUDA C++: a ``.cu``, its ``.h`` and a ``.json`` manifest.

The ``.cu`` holds the rendered kernel source verbatim, then a host launcher
``cudaError_t <basename>_forward(x, [weight,] [bias,] y, rows, eps, stream)`` with the launch
plan baked in (threads, dynamic shared memory, the grid rule of
:meth:`autonorm.codegen.LaunchPlan.grid`). For a resident plan (the bulk-copy kernel) the
launcher asks the CUDA occupancy API, once per device, how many clusters fit at once, as
:func:`autonorm.compiler.resident_clusters` does in process. It needs only the CUDA runtime: no
Python, CuPy or autonorm at run time. The weight and bias parameters exist only when the
problem has them, so a call cannot pass a tensor that the kernel would silently ignore.

:func:`render_export` is pure (text only, deterministic, no GPU); :func:`write_export` writes
it; :func:`export_kernel` does both for a given configuration, and :func:`export_from_db` for the
winner of the tuning database (falling back to :func:`autonorm.space.default_config`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autonorm.codegen.kernel import DYNAMIC_MIN_TILES, LaunchPlan, RenderedKernel
from autonorm.dtypes import SHORT_DTYPES, normalize_dtype
from autonorm.ops.base import rows_bucket
from autonorm.ops.layer_norm.codegen import code_version, render, template_environment
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.rules import check
from autonorm.ops.layer_norm.space import default_config
from autonorm.runtime import workspace
from autonorm.runtime.limits import H200, DeviceLimits
from autonorm.store.db import TuningDB, TuningKey, Winner

HEADER_TEMPLATE = "export_launcher.h.j2"
SOURCE_TEMPLATE = "export_launcher.cu.j2"
# Version of the manifest's layout, bumped when a key changes meaning or disappears.
MANIFEST_FORMAT = 1

_CTYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16"}
# Above 48 KiB of dynamic shared memory a kernel must opt in (cudaFuncSetAttribute).
_SMEM_DEFAULT_LIMIT = 48 * 1024
# nvcc diagnostics the kernel source triggers by design (as autonorm.compiler suppresses them).
_DIAG_SUPPRESS = (177, 550)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class DefaultConfigWarning(UserWarning):
    """Nothing was tuned for the problem: the untuned default configuration was exported."""


@dataclass(frozen=True)
class ExportedKernel:
    """The rendered files of one export, not yet written.

    Attributes:
        basename: the file stem and the launcher's prefix (``<basename>_forward``).
        header: text of ``<basename>.h``.
        source: text of ``<basename>.cu`` (the kernel, then the launcher).
        manifest: content of ``<basename>.json``.
        kernel: the rendered kernel it wraps.

    """

    basename: str
    header: str
    source: str
    manifest: dict[str, Any]
    kernel: RenderedKernel

    @property
    def files(self) -> dict[str, str]:
        """File name -> text, in the order they are written (.cu, .h, .json)."""
        return {
            f"{self.basename}.cu": self.source,
            f"{self.basename}.h": self.header,
            f"{self.basename}.json": json.dumps(self.manifest, indent=2, allow_nan=False) + "\n",
        }


@dataclass(frozen=True)
class TunedChoice:
    """The configuration :func:`find_tuned` picked for a problem, and where it came from.

    Attributes:
        config: the configuration to export.
        source: 'user' or 'shipped' (exact rows bucket, or the largest when no rows were
            given), 'user-nearest' or 'shipped-nearest' (nearest rows bucket), or 'default'.
        metrics: the winner's measured metrics (None for the default).
        device: the fingerprint of the GPU it was tuned on (None for the default).
        limits: the limits to validate and render for.
        rows_bucket: the rows bucket it was tuned for (None for the default).
        tuned_at: when it was tuned, ISO-8601 UTC (None for the default).
        notes: what a reader of the manifest should know, as (level, message) pairs.

    """

    config: KernelConfig
    source: str
    metrics: dict | None = None
    device: str | None = None
    limits: DeviceLimits = H200
    rows_bucket: int | None = None
    tuned_at: str | None = None
    notes: tuple[tuple[str, str], ...] = ()


def default_basename(problem: Problem) -> str:
    """Return the default file stem, e.g. ``autonorm_ln_bf16_h16384``.

    A problem without weight or bias gets ``_noweight`` / ``_nobias`` appended, so the variants
    of one hidden size can live in one directory and link into one program.
    """
    name = f"autonorm_ln_{SHORT_DTYPES[problem.dtype]}_h{problem.hidden}"
    if not problem.has_weight:
        name += "_noweight"
    if not problem.has_bias:
        name += "_nobias"
    return name


def describe_grid(config: KernelConfig, plan: LaunchPlan | None = None) -> str:
    """Return the grid rule of ``config``'s launch plan in words (for the header and manifest).

    Args:
        config: the kernel configuration.
        plan: its launch plan (:attr:`autonorm.codegen.RenderedKernel.launch`). Only a resident
            plan (``cache="bulk"``) needs it, to name the blocks per SM assumed when the
            occupancy API cannot answer; without it they are called the launch-bounds minimum.

    """
    tile = "row" if config.rows_per_block == 1 else f"{config.rows_per_block} rows"
    unit = "block" if config.cluster == 1 else f"cluster of {config.cluster} blocks"
    units = "clusters" if config.cluster > 1 else "blocks"
    if config.cache == "bulk":
        # The bulk-copy kernel is persistent whatever config.blocks_per_sm says (0); its grid
        # is sized by occupancy, so the rule names the query and its fallback.
        per_sm = "SMs * " + (str(plan.blocks_per_sm) if plan else "the launch-bounds minimum")
        if config.cluster > 1:
            per_sm += f" / {config.cluster}"
        return (
            f"one {unit} per {tile}, but at most as many {units} as the CUDA occupancy API says "
            f"can be resident at once (max(1, {per_sm}) if it cannot tell), which stride over "
            "the rows (persistent)"
        )
    if not config.blocks_per_sm:
        return f"one {unit} per {tile}"
    per_sm = f"SMs * {config.blocks_per_sm}"
    if config.cluster > 1:
        per_sm += f" / {config.cluster}"
    return (
        f"one {unit} per {tile}, but at most max(1, {per_sm}) {units}, which stride over the "
        "rows (persistent)"
    )


def render_export(
    config: KernelConfig,
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
        problem: hidden size, dtype and affine flags.
        metrics: measured metrics to record in the manifest (median_us, gbps, share, ...).
        device: limits to validate and render for (H200 when None, as in
            :func:`autonorm.codegen.render`).
        basename: the file stem and launcher prefix, a C identifier
            (default :func:`default_basename`).
        provenance: extra manifest entries saying where the configuration came from (``source``,
            ``tuned_for``, ``notes``); default ``"source": "explicit"``, no ``tuned_for`` (null)
            and no notes.

    Raises:
        autonorm.space.ConfigError: the configuration is invalid for the problem.
        ValueError: the basename is not a C identifier.

    """
    if basename is None:
        basename = default_basename(problem)
    if not _IDENTIFIER.fullmatch(basename):
        raise ValueError(f"basename must be a C identifier, got {basename!r}")
    kernel = render(config, problem, device)
    plan = kernel.launch
    grid_rule = describe_grid(config, plan)
    # Thread-block clusters and the bulk-copy engine (cp.async.bulk, mbarrier transactions)
    # exist from compute capability 9.0 on.
    min_cc = 90 if plan.cluster > 1 or plan.resident else None
    # The bulk-copy kernel's tile counter (autonorm.workspace); other kernels take none.
    workspace_bytes = workspace.COUNTER_BYTES if config.cache == "bulk" else 0
    context = {
        "basename": basename,
        "guard": f"{basename.upper()}_H_",
        "macro": basename.upper(),
        "version": code_version(),
        "label": config.label(),
        "kernel": kernel.name,
        "kernel_source": kernel.source,
        "dtype": problem.dtype,
        "ctype": _CTYPES[problem.dtype],
        "hidden": problem.hidden,
        "has_weight": problem.has_weight,
        "has_bias": problem.has_bias,
        "threads": plan.threads,
        "smem_bytes": plan.smem_bytes,
        "rows_per_block": plan.rows_per_block,
        "cluster": plan.cluster,
        "blocks_per_sm": plan.blocks_per_sm,
        "resident": plan.resident,
        "workspace_bytes": workspace_bytes,
        "dynamic_min_tiles": DYNAMIC_MIN_TILES,
        "grid_rule": grid_rule,
        "smem_default_limit": _SMEM_DEFAULT_LIMIT,
        "diag_suppress": _DIAG_SUPPRESS,
    }
    env = template_environment()
    header = env.get_template(HEADER_TEMPLATE).render(**context)
    source = env.get_template(SOURCE_TEMPLATE).render(**context)
    manifest = {
        "format": MANIFEST_FORMAT,
        "autonorm_version": code_version(),
        "basename": basename,
        "function": f"{basename}_forward",
        "function_with_workspace": f"{basename}_forward_ws",
        "workspace_bytes": workspace_bytes,
        "files": {"source": f"{basename}.cu", "header": f"{basename}.h"},
        "problem": dataclasses.asdict(problem),
        "config": config.to_dict(),
        "label": config.label(),
        "kernel_name": kernel.name,
        "launch": {
            **dataclasses.asdict(plan),
            "grid_rule": grid_rule,
            "min_compute_capability": min_cc,
        },
        "device_limits": dataclasses.asdict(device or H200),
        "source": "explicit",
        "tuned_for": None,
        "notes": [],
        **(provenance or {}),
        "metrics": _jsonable(metrics) if metrics is not None else None,
    }
    return ExportedKernel(basename, header, source, manifest, kernel)


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
    config: KernelConfig,
    problem: Problem,
    out_dir: Path,
    *,
    metrics: dict | None = None,
    device: DeviceLimits | None = None,
    basename: str | None = None,
) -> list[Path]:
    """Export ``config`` for ``problem`` into ``out_dir``: ``<basename>.cu``, ``.h``, ``.json``.

    Args:
        config: the kernel configuration.
        problem: hidden size, dtype and affine flags.
        out_dir: the directory to write into (created if missing).
        metrics: measured metrics to record in the manifest.
        device: limits to validate and render for (H200 when None).
        basename: file stem and launcher prefix (default :func:`default_basename`).

    Returns:
        The paths written: the .cu, the .h and the .json.

    Raises:
        autonorm.space.ConfigError: the configuration is invalid for the problem.
        ValueError: the basename is not a C identifier.

    """
    exported = render_export(config, problem, metrics=metrics, device=device, basename=basename)
    return write_export(exported, out_dir)


def export_from_db(
    hidden: int,
    dtype: str,
    out_dir: Path,
    *,
    has_weight: bool = True,
    has_bias: bool = True,
    rows: int | None = None,
    device_fingerprint: str | None = None,
    basename: str | None = None,
) -> list[Path]:
    """Export the tuned winner for a problem (see :func:`find_tuned`) into ``out_dir``.

    When nothing is tuned, exports :func:`autonorm.space.default_config` instead, with
    ``"source": "default"`` and a warning in the manifest's notes, and warns
    (:class:`DefaultConfigWarning`). No GPU is needed.

    Args:
        hidden: elements per row.
        dtype: 'float32', 'float16', 'bfloat16' or an alias ('bf16', ...).
        out_dir: the directory to write into (created if missing).
        has_weight: the problem multiplies by a weight.
        has_bias: the problem adds a bias.
        rows: the row count to export for; None takes the largest tuned rows bucket.
        device_fingerprint: the GPU to export for; None takes the only device with a winner
            for this problem, or the most recently tuned one.
        basename: file stem and launcher prefix (default :func:`default_basename`).

    Returns:
        The paths written: the .cu, the .h and the .json.

    Raises:
        ValueError: bad dtype, hidden size, rows or basename.
        autonorm.errors.DatabaseError: the user database cannot be opened.

    """
    if rows is not None and rows < 0:
        raise ValueError(f"rows must be >= 0, got {rows}")
    problem = Problem(hidden, normalize_dtype(dtype), has_weight, has_bias)
    choice = find_tuned(problem, rows=rows, device_fingerprint=device_fingerprint)
    if choice.source == "default":
        warnings.warn(choice.notes[0][1], DefaultConfigWarning, stacklevel=2)
    tuned_for = None
    if choice.device is not None:
        tuned_for = {
            "device": choice.device,
            "rows_bucket": choice.rows_bucket,
            "tuned_at": choice.tuned_at,
        }
    provenance = {
        "source": choice.source,
        "tuned_for": tuned_for,
        "notes": [{"level": level, "message": text} for level, text in choice.notes],
    }
    exported = render_export(
        choice.config,
        problem,
        metrics=choice.metrics,
        device=choice.limits,
        basename=basename,
        provenance=provenance,
    )
    return write_export(exported, out_dir)


def find_tuned(
    problem: Problem, *, rows: int | None = None, device_fingerprint: str | None = None
) -> TunedChoice:
    """Pick the configuration to export for ``problem`` from the tuning databases.

    Only winners of the current code version (:func:`autonorm.codegen.code_version`) count:
    the exported source is rendered by this autonorm, so a winner timed on other code says
    nothing about it. Lookup order, stopping at the first winner valid on its device:

    - ``rows`` given: the exact rows bucket (user DB, then shipped DB), then the nearest
      bucket (user, then shipped), as :mod:`autonorm.dispatch` does at run time;
    - ``rows`` None: the largest rows bucket (user DB, then shipped DB);
    - otherwise :func:`autonorm.space.default_config`.

    The device is ``device_fingerprint``, or else, per database, the only device with a winner
    for this problem, or the one tuned most recently.
    """
    stores: list[TuningDB] = [TuningDB.open_user()]
    try:
        shipped = TuningDB.open_shipped()
        if shipped is not None:
            stores.append(shipped)
        choice = _choose(stores, problem, rows, device_fingerprint)
    finally:
        for store in stores:
            store.close()
    return choice


# -- internals ------------------------------------------------------------------------------




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


def _describe(problem: Problem) -> str:
    flags = (("weight", problem.has_weight), ("bias", problem.has_bias))
    affine = [name for name, on in flags if on]
    return f"{problem.dtype} hidden {problem.hidden} ({', '.join(affine) or 'no weight or bias'})"


def _same_problem(winner: Winner, problem: Problem) -> bool:
    key = winner.key
    return (
        key.dtype == problem.dtype
        and key.hidden == problem.hidden
        and key.has_weight == problem.has_weight
        and key.has_bias == problem.has_bias
    )


def _limits(store: TuningDB, fingerprint: str) -> DeviceLimits | None:
    """Return the limits of a device recorded in ``store``, or None if it is not recorded."""
    for row in store.devices():
        if row["fingerprint"] == fingerprint:
            return DeviceLimits(
                name=row["name"],
                cc=int(row["cc"]),
                sm_count=int(row["sm_count"]),
                max_smem_optin=int(row["smem_optin"]),
                l2_bytes=int(row["l2_bytes"]),
            )
    return None


def _problem_key(problem: Problem, device: str, version: str, rows: int) -> TuningKey:
    return TuningKey.for_problem(device, version, problem, rows)


def _choose(
    stores: list[TuningDB], problem: Problem, rows: int | None, fingerprint: str | None
) -> TunedChoice:
    """Apply :func:`find_tuned`'s lookup order to open databases (user first)."""
    version = code_version()
    # Per database: the device to export for and its winners of this problem and version.
    candidates: list[tuple[TuningDB, str, list[Winner]]] = []
    stale = 0
    for store in stores:
        same = [w for w in store.winners(fingerprint) if _same_problem(w, problem)]
        current = [w for w in same if w.key.version == version]
        stale += len(same) - len(current)
        if current:
            device = fingerprint or max(current, key=lambda w: w.tuned_at).key.device
            candidates.append((store, device, [w for w in current if w.key.device == device]))

    def pick(store: TuningDB, device: str, winner: Winner, source: str) -> TunedChoice | None:
        limits = _limits(store, device)
        config = KernelConfig.from_dict(winner.config)
        if check(config, problem, limits or H200):
            return None
        notes = []
        if fingerprint is None:
            notes.append(("info", f"no device given: exported the winner tuned on {device}"))
        if limits is None:
            notes.append((
                "info",
                f"device {device} is not recorded in the {store.source} database: validated "
                f"and rendered for the limits of an {H200.name}",
            ))
        if source.endswith("-nearest"):
            notes.append((
                "info",
                f"no winner for {rows} rows (bucket {rows_bucket(rows or 1)}): exported the "
                f"nearest tuned bucket, {winner.key.rows_bucket}",
            ))
        return TunedChoice(
            config=config,
            source=source,
            metrics=winner.metrics,
            device=device,
            limits=limits or H200,
            rows_bucket=winner.key.rows_bucket,
            tuned_at=winner.tuned_at,
            notes=tuple(notes),
        )

    if rows is None:
        for store, device, winners in candidates:
            for winner in sorted(winners, key=lambda w: -w.key.rows_bucket):
                choice = pick(store, device, winner, store.source)
                if choice is not None:
                    return choice
    else:
        for exact in (True, False):
            for store, device, _ in candidates:
                key = _problem_key(problem, device, version, rows)
                winner = store.get_winner(key) if exact else store.nearest_winner(key)
                source = store.source if exact else f"{store.source}-nearest"
                choice = pick(store, device, winner, source) if winner is not None else None
                if choice is not None:
                    return choice
    return _fallback(stores, problem, fingerprint, version, stale)


def _fallback(
    stores: list[TuningDB], problem: Problem, fingerprint: str | None, version: str, stale: int
) -> TunedChoice:
    """Return the default configuration, with a warning note saying nothing was tuned."""
    limits = None
    if fingerprint is not None:
        limits = next((lim for s in stores if (lim := _limits(s, fingerprint))), None)
    where = f"on device {fingerprint}" if fingerprint else "on any device"
    notes = [(
        "warning",
        f"nothing is tuned for {_describe(problem)} {where} with autonorm {version} (user and "
        "shipped databases): exported the untuned default configuration; run `autonorm tune` "
        "on the target GPU for a faster kernel",
    )]
    if stale:
        notes.append((
            "info",
            f"ignored {stale} winner(s) of this problem tuned with other autonorm versions",
        ))
    limits = limits or H200
    config = default_config(problem, limits)
    return TunedChoice(config, "default", limits=limits, notes=tuple(notes))
