"""Run-time dispatch: find the kernel for this GPU and problem, compile it once, hand it out.

The configuration comes from :func:`autonorm.lookup.choose` over the user's tuning database
and the shipped one (exact rows bucket, nearest bucket, a tuned neighbour, then the family's
default for the row count); the family of the problem
(:func:`autonorm.ops.registry.family_of`) renders it. With tuning on first use
(:mod:`autonorm.tune.first_use`) a shape without an exact winner is tuned first.

Under ``AUTONORM_NO_KEEP_X=1`` a configuration with an L2 hint on x (LayerNorm's ``keep_x``)
is launched without it: the same arithmetic and bits, a kernel that leaves L2's priorities
alone (docs/l2-hints.md).

Where nothing is tuned and the default's kernel (or a neighbour's winner, carried over) spills
registers on this GPU, the default or the first leaner pick that does not
(:mod:`autonorm.fallback`) runs instead.

Compiled kernels are cached in the process: a call with a known key is a dict lookup, with no
database query and no compile.

With tuning on first use turned on (:mod:`autonorm.tune.first_use`), the first call of a key
whose rows bucket has no winner tunes it, stores the winner and caches that instead; other
threads' first calls wait meanwhile.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from autonorm.lookup import Choice
from autonorm.ops.base import Problem, rows_bucket

__all__ = ["Choice", "choose_config", "chosen", "clear_cache", "get_kernel"]

_KERNELS: dict[tuple[int, Problem, int], Any] = {}
_CHOICES: dict[tuple[int, Problem, int], Choice] = {}
_LOCK = threading.Lock()


def choose_config(problem: Problem, rows: int, device_id: int = 0) -> Choice:
    """Look up the configuration for ``problem`` at ``rows`` rows on a GPU (no compile).

    Under ``AUTONORM_NO_KEEP_X=1`` a configuration with ``keep_x`` on comes back with it off.
    """
    from autonorm import settings

    choice = _look_up(problem, rows, device_id)
    if getattr(choice.config, "keep_x", False) and not settings.keep_x_allowed():
        names = {f.name for f in dataclasses.fields(choice.config)}  # type: ignore[arg-type]
        if "keep_x" in names:
            config = dataclasses.replace(choice.config, keep_x=False)  # type: ignore[type-var]
            return dataclasses.replace(choice, config=config)
    return choice


def _look_up(problem: Problem, rows: int, device_id: int) -> Choice:
    """Ask :func:`autonorm.lookup.choose_with_shipped` with this GPU and the user's database."""
    from autonorm import lookup
    from autonorm.runtime.device import query_device
    from autonorm.store.db import TuningDB

    info = query_device(device_id)
    try:
        user = TuningDB.open_user_to_read()  # read-only where it cannot be written
    except Exception:  # noqa: BLE001 - a broken user DB must not stop inference
        user = None
    try:
        device = lookup.Device(info.fingerprint, info.limits())
        return lookup.choose_with_shipped(user, problem, rows, device)
    finally:
        if user is not None:
            user.close()


def get_kernel(problem: Problem, rows: int, device_id: int = 0) -> Any:
    """Return the compiled kernel for ``problem`` at ``rows`` rows on GPU ``device_id``.

    The first call for a key looks it up (and, if asked, tunes it: :mod:`autonorm.tune.first_use`)
    and compiles; later calls are a dict lookup.
    """
    key = (device_id, problem, rows_bucket(rows))
    kernel = _KERNELS.get(key)
    if kernel is not None:
        return kernel
    with _LOCK:
        kernel = _KERNELS.get(key)
        if kernel is None:
            from autonorm import settings
            from autonorm.runtime import compiler
            from autonorm.runtime.device import query_device
            from autonorm.tune import first_use

            settings.warn_unknown_variables()  # a misspelt setting changes nothing: say so
            choice = choose_config(problem, rows, device_id)
            # Opt-in: a shape with no winner for its rows bucket may be tuned now, once.
            choice = first_use.settle(problem, rows, device_id, choice, choose_config)
            limits = query_device(device_id).limits()
            choice, kernel, limits = _compile_placed(problem, rows, limits, choice, device_id)
            # No search measured a default or a neighbour's winner on this problem here.
            unmeasured = choice.source == "default" or choice.source.endswith("-neighbour")
            if unmeasured and compiler.local_bytes(kernel):
                choice, kernel = _without_spills(problem, rows, limits, choice, kernel,
                                                 device_id)
            _CHOICES[key] = choice
            _KERNELS[key] = kernel
    return kernel


def _compile_placed(
    problem: Problem, rows: int, limits: Any, choice: Choice, device_id: int
) -> tuple[Choice, Any, Any]:
    """Compile the pick, or the default on portable clusters where this device refuses it.

    A cluster past the portable size compiles only where the device places one (not every MIG
    slice of a Hopper does): there the default planned on portable clusters runs instead.

    Returns:
        The choice that runs, its compiled kernel and the limits it was planned for.
    """
    from autonorm.errors import CompileError
    from autonorm.ops.registry import family_of
    from autonorm.runtime import compiler

    family = family_of(problem)
    rendered = family.render(choice.config, problem, limits)
    try:
        kernel = compiler.compile_kernel(rendered, device_id)
    except CompileError:
        # The compiler's own test of a non-portable cluster, so both agree on which picks fall back.
        if not rendered.launch.large_cluster:
            raise
        limits = limits.portable()
        choice = Choice(family.default(problem, limits, rows), "default")
        kernel = compiler.compile_kernel(family.render(choice.config, problem, limits), device_id)
    return choice, kernel, limits


def _without_spills(
    problem: Problem, rows: int, limits: Any, choice: Choice, kernel: Any, device_id: int
) -> tuple[Choice, Any]:
    """Trade an unmeasured pick that spills on this GPU for the first lean default that does not.

    The default rule's register estimate is fitted to one compiler and architecture
    (:mod:`autonorm.fallback`), and a neighbour's winner was measured on another problem: where
    the kernel picked uses local memory here, the default (for a neighbour's) and then each
    leaner pick are compiled in turn. If every one spills too (or fails to compile), the pick
    stays.
    """
    from autonorm.errors import CompileError
    from autonorm.fallback import leaner_defaults
    from autonorm.ops.registry import family_of
    from autonorm.runtime import compiler

    family = family_of(problem)
    default = (choice.config if choice.source == "default"
               else family.default(problem, limits, rows))
    for config in [default, *leaner_defaults(problem, limits, rows, default)]:
        if config == choice.config:
            continue  # the pick that spilled (the default itself, where it was the pick)
        try:
            lean = compiler.compile_kernel(family.render(config, problem, limits), device_id)
        except CompileError:
            continue
        if not compiler.local_bytes(lean):
            return Choice(config, "default"), lean
    return choice, kernel


def chosen(problem: Problem, rows: int, device_id: int = 0) -> Choice | None:
    """Return what :func:`get_kernel` picked for this key, if it ran."""
    return _CHOICES.get((device_id, problem, rows_bucket(rows)))


def clear_cache() -> None:
    """Forget every compiled kernel and choice (after tuning, so new winners are used)."""
    with _LOCK:
        _KERNELS.clear()
        _CHOICES.clear()
