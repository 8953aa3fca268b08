"""The one winner lookup: which configuration runs a problem on a device, and where it came from.

Dispatch (at run time) and export (offline) both ask here. Given the open tuning databases,
user first, the order is:

1. the user's winner for the exact rows bucket, then the shipped one;
2. the user's winner of the nearest tuned bucket, then the shipped one, within
   ``NEAREST_MAX_OCTAVES`` of this bucket;
3. a neighbour's winner, carried over: the user's, then the shipped ones, of the other
   problems of the family that the family lets lend to this one (its optional
   ``neighbour_distance``: for LayerNorm the same dtype and affine flags, a hidden size less
   than 2x away on the same side of the vector grid) timed within ``NEIGHBOUR_MAX_OCTAVES``
   of the middle of this rows bucket; the nearest shape first (the family's distance plus the
   octaves between the row counts); the first whose configuration the family's rules accept
   for this problem;
4. the family's default configuration for the row count, sound for any problem.

Without a row count (an export of "the" kernel of a problem) each database offers its winners
from the largest bucket down instead, a neighbour's too.

A stored winner counts only if it still describes the kernel that would run: its configuration
must pass the family's rules on the device, and rendering it must give the kernel that was
timed, :func:`autonorm.codegen.environment.kernel_digest` being equal to the winner's
``kernel``. A neighbour's winner must pass the rules for both problems and render the kernel
that was timed for its own. A change of autonorm that leaves a kernel's code alone keeps its
winners; one that changes the code retires them (docs/tuning.md). A winner migrated from a
database older than schema 3 has no digest: it counts only if its family names the version
that tuned it in ``legacy_versions`` (versions whose kernels are proven to be rendered
unchanged today).

Nothing is cached here: dispatch caches what it picks, per process.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from autonorm.codegen.environment import kernel_digest
from autonorm.ops.base import problem_key, rows_bucket
from autonorm.ops.registry import family_of
from autonorm.store.keys import TuningKey, Winner

if TYPE_CHECKING:
    from autonorm.ops.base import Config, Problem
    from autonorm.runtime.limits import DeviceLimits
    from autonorm.store.db import TuningDB

# How far, in octaves, the row count a neighbour's winner was timed at may lie from the middle
# of the rows bucket looked up (4x): a kernel tuned for thousands of rows says little about a
# few, where the default has a rule of its own (its regimes change at factors of about 8). A
# shape of rows = 2^26 / hidden meets its neighbours' of 2^26 elements within 1.5.
NEIGHBOUR_MAX_OCTAVES = 2.0

# How far, in octaves, the nearest tuned bucket of the same problem may lie from the bucket
# looked up (16x). Further away the default for the row count is faster: on the H200, over the
# shipped problems at 1-8,192 rows, the winner of a bucket 5-7 octaves away ran 1.03-1.08x the
# default's time (geometric mean by octaves) and one 8-16 octaves away 1.06-1.21x, while within
# 4 octaves the winner ran 0.96-1.03x (docs/tuning.md, lookup).
NEAREST_MAX_OCTAVES = 4.0

# What a stored winner is to a problem on a device (see verdict()).
USABLE = "usable"

INVALID = "invalid"

STALE = "stale"


@dataclass(frozen=True)
class Device:
    """The GPU a lookup is for: its fingerprint (the key's device) and its limits."""

    fingerprint: str
    limits: DeviceLimits


@dataclass(frozen=True)
class Choice:
    """Which configuration the lookup picked, and where it came from.

    Attributes:
        config: the configuration to run.
        source: 'user' or 'shipped' (the exact rows bucket, or the largest one when no row
            count was given), 'user-nearest' or 'shipped-nearest' (the nearest tuned bucket),
            'user-neighbour' or 'shipped-neighbour' (another problem's winner, carried over),
            or 'default'.
        winner: the stored winner it came from (None for the default; a neighbour's has
            that problem's key). Two choices of the same configuration and source are equal
            whatever winner they came from.

    """

    config: Config
    source: str
    winner: Winner | None = field(default=None, compare=False)


def kernel_of(config: Config, problem: Problem, limits: DeviceLimits) -> str:
    """Return the digest of the kernel ``config`` renders for ``problem`` (what winners record).

    Raises:
        autonorm.errors.ConfigError: the configuration cannot run the problem on the device.

    """
    rendered = family_of(problem).render(config, problem, limits)
    return kernel_digest(rendered.source)


def verdict(winner: Winner, problem: Problem, limits: DeviceLimits) -> tuple[str, Config]:
    """Say whether a stored winner may run ``problem`` on a device of ``limits``.

    Returns:
        (``USABLE``, ``INVALID`` or ``STALE``, the winner's configuration): invalid when the
        family's rules refuse it on the device, stale when its configuration now renders
        another kernel than the one that was timed.

    Raises:
        TypeError, ValueError: the stored configuration is none of the family's.

    """
    family = family_of(problem)
    config = family.config_from_dict(winner.config)
    if family.check(config, problem, limits):
        return INVALID, config
    if winner.kernel is None:
        trusted = winner.legacy_version in getattr(family, "legacy_versions", frozenset())
        return (USABLE if trusted else STALE), config
    same = kernel_of(config, problem, limits) == winner.kernel
    return (USABLE if same else STALE), config


def choose(
    problem: Problem,
    rows: int | None,
    device: Device,
    stores: Sequence[TuningDB],
    *,
    devices: Sequence[Device] | None = None,
) -> Choice:
    """Pick the configuration for ``problem`` in the order of this module's docstring.

    Args:
        problem: what to run.
        rows: the row count (its bucket is looked up), or None for each database's largest
            tuned bucket.
        device: the GPU to run on; the default configuration is the one for its limits and
            ``rows``.
        stores: the open databases, in order of preference (the user's first).
        devices: the GPU to look up in each database, in the order of ``stores`` (default:
            ``device`` in every one); an export may take each database's winners of another
            GPU than the one it defaults for.

    """
    if devices is None:
        devices = [device] * len(stores)
    places = list(zip(stores, devices, strict=True))
    if rows is None:
        for store, place in places:
            key = TuningKey.for_problem(place.fingerprint, problem, 1)
            ranked = sorted(store.winners_by_distance(key), key=lambda w: -w.key.rows_bucket)
            choice = _first_usable(ranked, problem, place, store.source)
            if choice is not None:
                return choice
    else:
        for nearest in (False, True):
            for store, place in places:
                key = TuningKey.for_problem(place.fingerprint, problem, rows)
                if nearest:
                    found = [w for w in store.winners_by_distance(key)
                             if w.key.rows_bucket != key.rows_bucket
                             and _octaves(w.key.rows_bucket, key.rows_bucket)
                             <= NEAREST_MAX_OCTAVES]
                    source = f"{store.source}-nearest"
                else:
                    found = [w for w in (store.get_winner(key),) if w is not None]
                    source = store.source
                choice = _first_usable(found, problem, place, source)
                if choice is not None:
                    return choice
    for store, place in places:
        choice = _first_carried(_neighbours(store, place, problem, rows), problem, place,
                                f"{store.source}-neighbour")
        if choice is not None:
            return choice
    return Choice(family_of(problem).default(problem, device.limits, rows), "default")


@contextmanager
def dispatch_stores(user: TuningDB | None) -> Iterator[list[TuningDB]]:
    """Yield the databases dispatch looks in, in order: ``user`` (if given), then the shipped one.

    The shipped database is opened here and closed on exit; it is left out where it is switched
    off or is ``user``'s own file.
    """
    from pathlib import Path

    from autonorm.store.db import TuningDB

    stores = [user] if user is not None else []
    shipped = TuningDB.open_shipped()
    try:
        same = (shipped is not None and user is not None and user.path is not None
                and Path(user.path).resolve() == Path(shipped.path).resolve())
        if shipped is not None and not same:
            stores.append(shipped)
        yield stores
    finally:
        if shipped is not None:
            shipped.close()


def choose_with_shipped(
    user: TuningDB | None, problem: Problem, rows: int | None, device: Device
) -> Choice:
    """Pick as dispatch does, with ``user`` (an open database, or None) as the user's database.

    :func:`choose` over :func:`dispatch_stores`. The tuner asks :func:`choose` over those of the
    database it writes, for what runs for a key now.
    """
    with dispatch_stores(user) as stores:
        return choose(problem, rows, device, stores)


def retired_configs(
    stores: Sequence[TuningDB], key: TuningKey, problem: Problem, limits: DeviceLimits
) -> list[Config]:
    """Return the configurations that won ``key`` in ``stores`` before their kernels' code changed.

    A stored winner of the key (the tuner asks over :func:`dispatch_stores` of the database it
    writes) whose configuration now renders another kernel than the one that was timed is
    retired (:func:`verdict`: stale). It defends nothing, since its new kernel was never timed,
    but it is the best guess of what wins the key now: the tuner measures it right after what
    dispatch runs, so that tuning again after a change of autonorm starts where the last tuning
    ended.
    """
    found = (stored_verdict(store, key, problem, limits) for store in stores)
    return [config for status, config in filter(None, found) if status == STALE]


def stored_verdict(
    store: TuningDB, key: TuningKey, problem: Problem, limits: DeviceLimits
) -> tuple[str, Config] | None:
    """Return :func:`verdict` on ``store``'s winner of ``key``.

    None where ``store`` holds no winner of the key, or one whose configuration the family
    cannot read (never run, defended or seeded).
    """
    winner = store.get_winner(key)
    if winner is None:
        return None
    try:
        return verdict(winner, problem, limits)
    except (TypeError, ValueError):
        return None


def _first_usable(
    winners: Sequence[Winner], problem: Problem, device: Device, source: str
) -> Choice | None:
    for winner in winners:
        try:
            status, config = verdict(winner, problem, device.limits)
        except (TypeError, ValueError):
            continue  # a stored configuration the family cannot read: never run it
        if status == USABLE:
            return Choice(config, source, winner)
    return None


def _neighbours(
    store: TuningDB, device: Device, problem: Problem, rows: int | None
) -> list[tuple[Problem, Winner]]:
    """The winners other problems of the family lend to ``problem``, nearest first.

    A winner is a shape, a problem and a row count: nearest is the family's distance plus the
    octaves between the row count it was timed at and the middle of the bucket looked up (a
    bucket spans an octave: a winner timed at 16,384 rows and a launch of 16,810 fall in two).
    So a winner of the same regime of rows a little further in hidden size comes before one
    tuned for another regime (bf16 9488 at 7,073 rows: the 2^26-element winner of 12288, a bulk
    kernel, before 8192's at 4,096 rows, a row kernel). Ties go to the nearer row count, then
    the larger bucket; without a row count the largest bucket comes first. Winners timed more
    than ``NEIGHBOUR_MAX_OCTAVES`` away are left out.
    """
    family = family_of(problem)
    distance_of = getattr(family, "neighbour_distance", None)
    if distance_of is None:
        return []
    own = problem_key(problem)
    # The bucket's middle, in octaves: buckets hold (bucket / 2, bucket] rows.
    target = None if rows is None else math.log2(rows_bucket(rows)) - 0.5
    ranked = []
    for winner in store.winners(device.fingerprint, type(problem).op, dtype=problem.dtype):
        if winner.key.problem == own:
            continue  # this problem's own winners: the steps before
        try:
            other = family.problem(**winner.key.fields)
        except (TypeError, ValueError):
            continue  # stored fields the family cannot read
        distance = distance_of(problem, other)
        if distance is None:
            continue
        octaves = 0.0 if target is None else abs(_timed_octave(winner) - target)
        if octaves <= NEIGHBOUR_MAX_OCTAVES:
            order = (distance + octaves, octaves, -winner.key.rows_bucket)
            ranked.append((order, other, winner))
    ranked.sort(key=lambda entry: entry[0])
    return [(other, winner) for _, other, winner in ranked]


def _timed_octave(winner: Winner) -> float:
    """log2 of the row count a winner was timed at (its bucket's middle where not recorded)."""
    rows = winner.metrics.get("rows") if isinstance(winner.metrics, dict) else None
    if isinstance(rows, int) and not isinstance(rows, bool) and rows > 0:
        return math.log2(rows)
    return math.log2(winner.key.rows_bucket) - 0.5


def _first_carried(
    neighbours: Sequence[tuple[Problem, Winner]], problem: Problem, device: Device, source: str
) -> Choice | None:
    """The first neighbour's winner current for its own problem and valid for ``problem``."""
    family = family_of(problem)
    for other, winner in neighbours:
        try:
            config = family.config_from_dict(winner.config)
            if family.check(config, problem, device.limits):
                continue  # the family's rules refuse it for this problem
            status, _ = verdict(winner, other, device.limits)
        except (TypeError, ValueError):
            continue  # a stored configuration the family cannot read: never run it
        if status == USABLE:
            return Choice(config, source, winner)
    return None


def _octaves(bucket: int, other: int) -> float:
    """How many octaves apart two rows buckets are."""
    return abs(math.log2(bucket) - math.log2(other))
