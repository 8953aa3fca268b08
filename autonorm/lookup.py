"""The one winner lookup: which configuration runs a problem on a device, and where it came from.

Dispatch (at run time) and export (offline) both ask here. Given the open tuning databases,
user first, the order is:

1. the user's winner for the exact rows bucket, then the shipped one;
2. the user's winner of the nearest tuned bucket, then the shipped one;
3. the family's default configuration, sound for any problem.

Without a row count (an export of "the" kernel of a problem) each database offers its winners
from the largest bucket down instead.

A stored winner counts only if it still describes the kernel that would run: its configuration
must pass the family's rules on the device, and rendering it must give the kernel that was
timed, :func:`autonorm.codegen.environment.kernel_digest` being equal to the winner's
``kernel``. A change of autonorm that leaves a kernel's code alone keeps its winners; one that
changes the code retires them (docs/tuning.md). A winner migrated from a database older than
schema 3 has no digest: it counts only if its family names the version that tuned it in
``legacy_versions`` (versions whose kernels are proven to be rendered unchanged today).

Nothing is cached here: dispatch caches what it picks, per process.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from autonorm.codegen.environment import kernel_digest
from autonorm.ops.registry import family_of
from autonorm.store.keys import TuningKey, Winner

if TYPE_CHECKING:
    from autonorm.ops.base import Config, Problem
    from autonorm.runtime.limits import DeviceLimits
    from autonorm.store.db import TuningDB

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
            or 'default'.
        winner: the stored winner it came from (None for the default). Two choices of the
            same configuration and source are equal whatever winner they came from.

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
        device: the GPU to run on; the default configuration is the one for its limits.
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
                             if w.key.rows_bucket != key.rows_bucket]
                    source = f"{store.source}-nearest"
                else:
                    found = [w for w in (store.get_winner(key),) if w is not None]
                    source = store.source
                choice = _first_usable(found, problem, place, source)
                if choice is not None:
                    return choice
    return Choice(family_of(problem).default(problem, device.limits), "default")


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
