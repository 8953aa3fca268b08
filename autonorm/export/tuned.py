"""Export the tuned kernel of a problem: the winner :mod:`autonorm.lookup` picks, or the default.

Export runs without a GPU, so it also says which GPU it exports for: the one given, or else,
per database, the only device with a usable winner for the problem, or the one tuned most
recently. The limits of that device come from the database's devices table (an H200's when it
is not recorded). An export for a kind of GPU (``arch``, a compute capability) takes only the
winners of devices of that kind, and otherwise the default configuration for the kind's limits
(:mod:`autonorm.export.arch`); where nvcc spills that default for the architecture, the leaner
pick dispatch would run there. What a reader of the export should know about that choice goes
into the manifest's notes.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autonorm import lookup
from autonorm.dtypes import normalize_dtype
from autonorm.errors import AutonormError
from autonorm.export import arch as arches
from autonorm.export.files import render_export, write_export
from autonorm.ops import registry
from autonorm.ops.base import Config, Problem, problem_key, rows_bucket
from autonorm.runtime.limits import H200, DeviceLimits
from autonorm.store.db import TuningDB


class DefaultConfigWarning(UserWarning):
    """Nothing was tuned for the problem: the untuned default configuration was exported."""


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

    config: Config
    source: str
    metrics: dict | None = None
    device: str | None = None
    limits: DeviceLimits = H200
    rows_bucket: int | None = None
    tuned_at: str | None = None
    notes: tuple[tuple[str, str], ...] = ()


def export_from_db(
    hidden: int,
    dtype: str,
    out_dir: Path,
    *,
    op: str = "layer_norm",
    rows: int | None = None,
    device_fingerprint: str | None = None,
    arch: int | None = None,
    basename: str | None = None,
    **fields: Any,
) -> list[Path]:
    """Export the tuned winner for a problem of ``op`` (see :func:`export_tuned`).

    Args:
        hidden: elements per row.
        dtype: 'float32', 'float16', 'bfloat16' or an alias ('bf16', ...).
        out_dir: the directory to write into (created if missing).
        op: the kernel family.
        rows: the row count to export for; None takes the largest tuned rows bucket.
        device_fingerprint: the GPU to export for (see :func:`find_tuned`).
        arch: the compute capability of the kind of GPU to export for (e.g. 80).
        basename: file stem (default :func:`autonorm.export.files.default_basename`).
        **fields: the family's other problem fields (LayerNorm: ``has_weight``, ``has_bias``;
            RMSNorm: ``has_weight``, ``weight_offset``, ``residual``).

    Returns:
        The paths written, the manifest last.

    Raises:
        ValueError: bad dtype, hidden size, problem fields, rows or basename.
        KeyError: unknown op.
        autonorm.errors.DatabaseError: the user database cannot be opened.

    """
    problem = registry.get(op).problem(hidden=hidden, dtype=normalize_dtype(dtype), **fields)
    return export_tuned(problem, out_dir, rows=rows, device_fingerprint=device_fingerprint,
                        arch=arch, basename=basename)


def export_tuned(
    problem: Problem,
    out_dir: Path,
    *,
    rows: int | None = None,
    device_fingerprint: str | None = None,
    arch: int | None = None,
    basename: str | None = None,
) -> list[Path]:
    """Export the tuned winner for ``problem`` (see :func:`find_tuned`) into ``out_dir``.

    When nothing is tuned, exports the family's default configuration instead, with
    ``"source": "default"`` and a warning in the manifest's notes, and warns
    (:class:`DefaultConfigWarning`). No GPU is needed.
    """
    if rows is not None and rows < 0:
        raise ValueError(f"rows must be >= 0, got {rows}")
    choice = find_tuned(problem, rows=rows, device_fingerprint=device_fingerprint, arch=arch)
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
    problem: Problem, *, rows: int | None = None, device_fingerprint: str | None = None,
    arch: int | None = None,
) -> TunedChoice:
    """Pick the configuration to export for ``problem`` from the user and shipped databases.

    The order is :func:`autonorm.lookup.choose`'s, and so is the test of a winner: it must
    still render the kernel that was timed, since the exported source is rendered by this
    autonorm. The device is ``device_fingerprint``, or else, per database, the only device with
    a winner for this problem, or the one tuned most recently; with ``arch`` (a compute
    capability), only devices of that kind count, and without a winner the default is rendered
    for the kind's limits.

    Raises:
        AutonormError: ``arch`` is neither recorded in a database nor known
            (:data:`autonorm.export.arch.KNOWN`).
        autonorm.errors.DatabaseError: a database cannot be read.

    """
    stores: list[TuningDB] = []
    try:
        for store in (TuningDB.open_user_to_read(), TuningDB.open_shipped()):
            if store is not None:
                stores.append(store)
        choice = choose_tuned(stores, problem, rows, device_fingerprint, arch)
    finally:
        for store in stores:
            store.close()
    return choice


def choose_tuned(
    stores: list[TuningDB], problem: Problem, rows: int | None, fingerprint: str | None,
    arch: int | None = None,
) -> TunedChoice:
    """Apply :func:`find_tuned`'s choice to open databases (user first)."""
    op, key_problem = type(problem).op, problem_key(problem)
    searched: list[TuningDB] = []
    devices: list[lookup.Device] = []
    stale = 0
    for store in stores:
        current = []
        for winner in store.winners(fingerprint, op, problem=key_problem):
            limits = store.device_limits(winner.key.device) or H200
            if arch is not None and limits.cc != arch:
                continue  # a winner of another kind of GPU
            try:
                status, _ = lookup.verdict(winner, problem, limits)
            except (TypeError, ValueError):  # not a configuration of this family
                status = lookup.INVALID
            stale += status == lookup.STALE
            if status != lookup.STALE:
                current.append(winner)
        if current:
            device = fingerprint or max(current, key=lambda w: w.tuned_at).key.device
            searched.append(store)
            devices.append(lookup.Device(device, store.device_limits(device) or H200))

    recorded = None
    if fingerprint is not None:
        recorded = next((lim for s in stores if (lim := s.device_limits(fingerprint))), None)
    if arch is not None and recorded is None:
        recorded = kind_limits(stores, arch)
    fallback = lookup.Device(fingerprint or "", recorded or H200)
    choice = lookup.choose(problem, rows, fallback, searched, devices=devices)
    if choice.winner is None:
        return _default(choice, problem, fingerprint, fallback.limits, stale, arch, rows)
    winner = choice.winner
    store = next(s for s in searched if s.source == winner.source)
    recorded = store.device_limits(winner.key.device)
    notes = []
    if fingerprint is None:
        notes.append(("info", f"no device given: exported the winner tuned on {winner.key.device}"))
    if recorded is None:
        notes.append((
            "info",
            f"device {winner.key.device} is not recorded in the {store.source} database: "
            f"validated and rendered for the limits of an {H200.name}",
        ))
    if choice.source.endswith("-nearest"):
        notes.append((
            "info",
            f"no winner for {rows} rows (bucket {rows_bucket(rows or 1)}): exported the "
            f"nearest tuned bucket, {winner.key.rows_bucket}",
        ))
    return TunedChoice(
        config=choice.config,
        source=choice.source,
        metrics=winner.metrics,
        device=winner.key.device,
        limits=recorded or H200,
        rows_bucket=winner.key.rows_bucket,
        tuned_at=winner.tuned_at,
        notes=tuple(notes),
    )


def kind_limits(stores: list[TuningDB], cc: int) -> DeviceLimits:
    """Return the limits of the kind of GPU of compute capability ``cc``.

    Those of a recorded device of that kind (the one first seen most recently), else the
    datasheet values of :data:`autonorm.export.arch.KNOWN`.

    Raises:
        AutonormError: no database records a device of that kind, and it is not known.

    """
    for store in stores:
        kind = [d for d in store.devices() if d["cc"] == cc]
        if kind:
            newest = max(kind, key=lambda d: d["first_seen"])
            limits = store.device_limits(newest["fingerprint"])
            if limits is not None:
                return limits
    if cc in arches.KNOWN:
        return arches.KNOWN[cc]
    known = ", ".join(arches.arch_name(c) for c in sorted(arches.KNOWN))
    raise AutonormError(
        f"no tuning database records a GPU of {arches.arch_name(cc)}, and autonorm knows the "
        f"limits of {known} only: tune on such a GPU, or export for one of those"
    )


def _default(
    choice: lookup.Choice, problem: Problem, fingerprint: str | None, limits: DeviceLimits,
    stale: int, arch: int | None = None, rows: int | None = None,
) -> TunedChoice:
    """Return the default configuration, with a warning note saying nothing was tuned.

    The note names the op: a problem's description alone does not tell RMSNorm from LayerNorm.
    Where nvcc spills the default for the limits' architecture, the leaner pick dispatch would
    run there is exported instead (:func:`_without_spills`).
    """
    version = registry.family_of(problem).code_version()
    op = type(problem).op
    where = f"on device {fingerprint}" if fingerprint else "on any device"
    if arch is not None:
        where = f"on any {arches.arch_name(arch)} device"
    notes = [(
        "warning",
        f"nothing is tuned for {problem.describe()}, op {op}, {where} with autonorm {version} "
        "(user and shipped databases): exported the untuned default configuration; run "
        f"`autonorm tune --op {op}` on the target GPU for a faster kernel",
    )]
    if arch is not None:
        notes.append(("info", f"rendered for the limits of an {limits.name} "
                              f"({arches.arch_name(limits.cc)}, {limits.sm_count} SMs)"))
    if stale:
        notes.append((
            "info",
            f"ignored {stale} winner(s) of this problem tuned with other autonorm versions: "
            "their configurations render other kernels now",
        ))
    config, spill_note = _without_spills(problem, rows, limits, choice.config)
    if spill_note:
        notes.append(("info", spill_note))
    return TunedChoice(config, "default", limits=limits, notes=tuple(notes))


def _without_spills(
    problem: Problem, rows: int | None, limits: DeviceLimits, config: Config
) -> tuple[Config, str | None]:
    """Return ``config``, or the first leaner pick where nvcc spills it; and a note, if any.

    On a GPU, dispatch trades a default whose kernel spills for the first leaner pick that does
    not (:mod:`autonorm.fallback`). An export has no GPU to ask, so it asks nvcc for the
    limits' architecture where nvcc is installed; without nvcc, or where nvcc fails, the
    default goes out as it is.
    """
    from autonorm.errors import CompileError
    from autonorm.fallback import leaner_offline
    from autonorm.runtime import offline

    if offline.nvcc_path() is None:
        return config, None
    try:
        first = registry.family_of(problem).render(config, problem, limits)
        report = offline.compile_offline([first], limits.arch)[first.name]
        if not report.spills:
            return config, None
        (pick,) = leaner_offline([(problem, rows, config)], limits)
    except CompileError:
        return config, None
    spilled = (f"the default {config.label()} spills {report.spill_stores} bytes under nvcc "
               f"for {limits.arch}")
    if pick is not None:
        return pick, f"{spilled}: exported {pick.label()}, the leaner pick that does not"
    return config, f"{spilled}, and so do its leaner picks: exported it as it is"
