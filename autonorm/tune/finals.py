"""The finals of a search: re-time the best candidates against the incumbent, together.

Search timings of different candidates are taken minutes apart, and a GPU's clocks and
neighbours drift in between; the finals time the few best and the configuration in use now
interleaved, round after round, so they see the same conditions. The incumbent stays unless a
challenger is faster by more than the noise (docs/tuning.md, docs/timing.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from optuna.trial import FrozenTrial, TrialState

from autonorm.ops.base import Config, Family, Problem
from autonorm.ops.registry import family_of
from autonorm.results import Timing
from autonorm.runtime.limits import DeviceLimits
from autonorm.tune.trials import params_key

if TYPE_CHECKING:
    from autonorm.tune.search import Evaluator

__all__ = ["beats", "ranked_configs", "run_finals"]


def ranked_configs(trials: Sequence[FrozenTrial], family: Family) -> list[Config]:
    """Return the distinct completed configurations of the study, fastest first."""
    done = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None]
    seen: set[tuple] = set()
    ranked = []
    for trial in sorted(done, key=lambda t: (t.value, t.number)):
        key = params_key(trial.params)
        if key not in seen:
            seen.add(key)
            ranked.append(family.config_from_dict(trial.params))
    return ranked


def beats(challenger: Timing, incumbent: Timing, noise: float) -> bool:
    """Return True if ``challenger`` is faster by more than the noise of either timing."""
    margin = max(noise, 2 * incumbent.cv, 2 * challenger.cv)
    return (incumbent.median_us - challenger.median_us) / incumbent.median_us > margin


def run_finals(
    trials: Sequence[FrozenTrial],
    evaluator: Evaluator,
    problem: Problem,
    limits: DeviceLimits,
    *,
    incumbent: Config | None,
    top: int,
    rounds: int,
    noise: float,
    default: Config | None = None,
) -> tuple[Config | None, Timing | None, str | None]:
    """Re-time the best candidates and a defender together; return (best, timing, kept).

    The defender is the incumbent, or where there is none that may still run, ``default`` if
    the study measured it (so it passed verification): without a stored winner dispatch runs
    the default, so a challenger must beat it as clearly as it would a stored winner, in the
    finals' regime: the search's back-to-back timing ranks kernels apart from single launches
    (docs/tuning.md), and a default left out of the finals was judged by that alone.
    ``kept`` says which defender stayed: ``"incumbent"``, ``"default"`` or None.

    Args:
        trials: the study's trials.
        evaluator: times the contenders (its ``retime``).
        problem: what they compute.
        limits: the device limits that decide validity.
        incumbent: the configuration in use now, or None.
        top: distinct challengers to re-time, fastest first.
        rounds: interleaved rounds.
        noise: smallest relative speed-up that replaces the defender (see :func:`beats`).
        default: the configuration that runs where no winner is stored (the family's default).

    """
    family = family_of(problem)
    if incumbent is not None and family.check(incumbent, problem, limits):
        incumbent = None  # it cannot run this problem any more: nothing to defend
    ranked = ranked_configs(trials, family)
    defender, kind = incumbent, "incumbent"
    if defender is None and default is not None and default in ranked:
        defender, kind = default, "default"
    challengers = [
        c for c in ranked if c != defender and not family.check(c, problem, limits)
    ][:top]
    contenders = ([defender] if defender is not None else []) + challengers
    if not contenders:
        return None, None, None
    timings = evaluator.retime(contenders, rounds)
    timed = dict(zip(contenders, timings, strict=True))
    if not challengers:
        return defender, timed[defender], kind
    fastest = min(challengers, key=lambda c: timed[c].median_us)
    if defender is None or beats(timed[fastest], timed[defender], noise):
        return fastest, timed[fastest], None
    return defender, timed[defender], kind
