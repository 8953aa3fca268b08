"""How ``autonorm tune`` tunes a plan of several shapes, and the table it ends with.

The plan itself (which shapes, their order, the budget split, the resume check) is
:mod:`autonorm.tune.plan`; this module runs it: it skips the shapes already stored, tunes the
others one after another through :func:`autonorm.tune.session.tune_and_store` under one
progress display on stderr (a bar on a terminal, one line a shape otherwise) and prints the
summary table on stdout.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import click

from autonorm import __version__
from autonorm.ops import registry
from autonorm.ops.base import Problem
from autonorm.results import Outcome, Timing
from autonorm.runtime.device import DeviceInfo
from autonorm.tune import model_config, plan
from autonorm.tune.interrupt import terminate_as_interrupt
from autonorm.tune.plan import Shape
from autonorm.tune.progress import ProgressBar
from autonorm.tune.search import TuneSettings

# The summary's source column: what became of a shape.
TUNED, STORED, FAILED, NOT_REACHED = "tuned", "already stored", "failed", "budget spent"


@dataclass(frozen=True)
class PlanResult:
    """What became of one shape of a plan (a row of the summary table)."""

    shape: Shape
    source: str
    label: str = "-"
    median_us: float | None = None
    share: float | None = None
    note: str = ""


def _say(line: str) -> None:
    click.echo(line, err=True)


def _from_metrics(shape: Shape, source: str, label: str, metrics: dict[str, Any] | None,
                  note: str = "") -> PlanResult:
    metrics = metrics or {}
    return PlanResult(shape, source, label, metrics.get("median_us"), metrics.get("share"),
                      note)


class _Counter:
    """The on_trial of one shape: moves the plan's display on by each candidate measured."""

    def __init__(self, bar: ProgressBar, before: int, trials: int) -> None:
        self.bar, self.before, self.trials = bar, before, trials
        self.done, self.best = 0, None

    def __call__(self, config: Any, outcome: Outcome, number: int) -> None:
        if outcome.status == "invalid":
            return  # skipped before compiling: not one of the candidates to measure
        self.done = min(self.done + 1, self.trials)
        timing: Timing | None = outcome.timing
        if timing is not None and (self.best is None or timing.median_us < self.best.median_us):
            self.best = timing
        self.bar.update(self.before + self.done, self.best)


def stored_winners(shapes: Sequence[Shape], problems: Sequence[Problem],
                   device: DeviceInfo) -> dict[int, Any]:
    """The usable winners of the user's database for the plan's shapes, by shape index.

    These are the shapes a plan skips unless ``--force`` (:func:`autonorm.tune.plan.usable_winner`).
    """
    from autonorm.store.db import TuningDB

    limits = device.limits()
    stored: dict[int, Any] = {}
    store = TuningDB.open_user_to_read()
    try:
        for i, (shape, problem) in enumerate(zip(shapes, problems, strict=True)):
            winner = plan.usable_winner(store, device.fingerprint, shape, problem, limits)
            if winner is not None:
                stored[i] = winner
    finally:
        if store is not None:
            store.close()
    return stored


def tune_plan(
    shapes: Sequence[Shape],
    problems: Sequence[Problem],
    device: DeviceInfo,
    *,
    settings: TuneSettings,
    budget: float | None,
    force: bool,
    storage: str | None,
    workers: int,
    results: list[PlanResult],
    gpus: Sequence[int] | None = None,
) -> None:
    """Tune every shape of a plan that has no usable winner yet (all with ``force``).

    Appends one :class:`PlanResult` a shape to ``results`` as it goes, so a caller that sees
    an interrupt still has the shapes finished before it. ``gpus``: each worker's GPU
    (:func:`worker_gpus`).
    """
    from autonorm.tune import session
    from autonorm.tune.failures import describe_failed

    stored = {} if force else stored_winners(shapes, problems, device)
    todo = [i for i in range(len(shapes)) if i not in stored]
    budget_text = f", budget {budget:g} s" if budget is not None else ""
    _say(f"autonorm {__version__}: tuning a plan of {len(shapes)} shapes on {device.name} "
         f"({device.sm_count} SMs): {len(stored)} already stored, {len(todo)} to tune"
         f"{budget_text}")
    terminal = sys.stderr.isatty()
    started = time.monotonic()
    with ProgressBar(terminal, f"tuning {len(todo)} shapes",
                     len(todo) * settings.n_trials) as bar:
        for i, (shape, problem) in enumerate(zip(shapes, problems, strict=True)):
            if i in stored:
                winner = stored[i]
                label = registry.get(shape.op).config_from_dict(winner.config).label()
                results.append(_from_metrics(shape, STORED, label, winner.metrics))
                continue
            place = todo.index(i)
            step = f"[{place + 1}/{len(todo)}] {shape.describe()}"
            timeout = plan.shape_timeout(settings.timeout_s, budget,
                                         time.monotonic() - started, len(todo) - place)
            if timeout is None:
                results.append(PlanResult(shape, NOT_REACHED))
                continue
            if not terminal:
                _say(f"{step}: tuning (up to {settings.n_trials} candidates, {timeout:.0f} s)")
            counter = _Counter(bar, place * settings.n_trials, settings.n_trials)
            tuned = session.tune_and_store(
                problem, shape.rows, settings=replace(settings, timeout_s=timeout),
                device=device, storage=storage, workers=workers, gpus=gpus, quiet=True,
                on_trial=counter,
            )
            bar.update((place + 1) * settings.n_trials, counter.best)
            if tuned.stored and tuned.config is not None:
                result = _from_metrics(shape, TUNED, tuned.config.label(), tuned.metrics)
            elif tuned.evaluated == 0:  # its share of the budget ran out before a measurement
                result = PlanResult(shape, NOT_REACHED, note=f"none measured in {timeout:.1f} s")
            else:
                result = PlanResult(shape, FAILED, note="no candidate passed verification")
            results.append(result)
            if not terminal:
                _say(f"{step}: {describe_result(result)} ({tuned.elapsed_s:.1f} s)")
            for line in describe_failed(tuned.failed):
                _say(f"{step}: {line}")


def describe_result(result: PlanResult) -> str:
    """Say what became of a shape in a few words (a progress line)."""
    if result.median_us is None:
        return f"{result.source}: {result.note}" if result.note else result.source
    share = f", {result.share * 100:.1f}% of copy" if result.share is not None else ""
    return f"{result.source}: {result.label}, {result.median_us:.1f} us{share}"


def summary_lines(results: Sequence[PlanResult]) -> list[str]:
    """Return the summary table: one row a shape, its winner, time, share of copy, source."""
    header = ("shape", "winner", "us", "% copy", "source")
    rows = [header] + [
        (r.shape.describe(), r.label,
         "-" if r.median_us is None else f"{r.median_us:.1f}",
         "-" if r.share is None else f"{r.share * 100:.1f}",
         r.source + (f" ({r.note})" if r.note else ""))
        for r in results
    ]
    widths = [max(len(row[c]) for row in rows) for c in range(len(header))]
    lines = []
    for row in rows:
        cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1]), row[2].rjust(widths[2]),
                 row[3].rjust(widths[3]), row[4]]
        lines.append("  ".join(cells).rstrip())
    return lines


def print_summary(results: Sequence[PlanResult]) -> None:
    """Print the summary table on stdout and, on stderr, what is left to a rerun."""
    for line in summary_lines(results):
        click.echo(line)
    left = sum(r.source == NOT_REACHED for r in results)
    if left:
        _say(f"{left} of {len(results)} shapes not tuned within the budget: run the same "
             "command to continue")


def worker_gpus(workers: int) -> list[int] | None:
    """Give each of ``workers`` processes a GPU this process sees, saying so where they share.

    One worker needs no assignment (None: it runs here). More workers than GPUs share them
    round-robin (:func:`autonorm.tune.workers.assign_gpus`), with one line on stderr naming the
    GPUs shared. Call after :func:`autonorm.runtime.device.query_device` found a GPU.

    Raises:
        click.ClickException: the GPUs cannot be counted.

    """
    if workers == 1:
        return None
    from autonorm.runtime.device import NoGPUError
    from autonorm.tune import workers as worker_pool

    try:
        count = worker_pool.visible_gpu_count()
    except NoGPUError as exc:
        raise click.ClickException(f"autonorm tune --workers needs CUDA GPUs: {exc}") from None
    notice = worker_pool.sharing_notice(workers, count)
    if notice is not None:
        _say(notice)
    return worker_pool.assign_gpus(workers, count)


def _plan(*, ops: Sequence[str], hiddens: Sequence[int], dtypes: Sequence[str],
          rows: Sequence[int], configs: Sequence[str], no_weight: bool, no_bias: bool,
          weight_offset: bool, residual: bool | None, default_op: str,
          default_rows: Any, backward: bool = False,
          ) -> tuple[list[model_config.ModelNorm], list[Shape], list[Problem]]:
    """Read the model configs and expand the options into the plan's shapes and problems.

    With ``backward`` the ops are backward families and a config's norms are planned as their
    backward (:func:`autonorm.tune.model_config.backward_norms`).

    Raises:
        click.BadParameter: a config or option the plan cannot use (naming it).
        click.UsageError: a shape whose op's problem cannot take it (:func:`_problems`).
    """
    try:
        # Read as the first op of --op: expand gives each norm every op of --op.
        norms = model_config.read_norms(configs, op=ops[0] if ops else None, backward=backward)
        shapes = plan.expand(ops=ops, hiddens=hiddens, dtypes=dtypes, rows=rows,
                             default_rows=default_rows, norms=norms, has_weight=not no_weight,
                             has_bias=not no_bias, weight_offset=weight_offset,
                             residual=residual, default_op=default_op)
    except model_config.PlanError as exc:
        raise click.BadParameter(str(exc), param_hint=exc.option) from None
    return norms, shapes, _problems(shapes)


def list_plan(
    *, ops: Sequence[str], hiddens: Sequence[int], dtypes: Sequence[str], rows: Sequence[int],
    configs: Sequence[str], no_weight: bool, no_bias: bool, weight_offset: bool,
    residual: bool | None, residual_dtype: str | None, default_op: str, default_rows: Any,
    timeout: float, budget: float | None, force: bool, backward: bool = False,
) -> None:
    """Print the shapes ``autonorm tune`` would tune (``--dry-run``), a line each, on stdout.

    On a GPU each shape with a usable winner in the user's database says so (the tuning would
    skip it, unless ``force``); without one, that is left unsaid. Tunes nothing.
    """
    from autonorm.runtime.device import NoGPUError, query_device

    _, shapes, problems = _plan(
        ops=ops, hiddens=hiddens, dtypes=dtypes, rows=rows, configs=configs,
        no_weight=no_weight, no_bias=no_bias, weight_offset=weight_offset, residual=residual,
        default_op=default_op, default_rows=default_rows, backward=backward)
    try:
        device = query_device()
    except NoGPUError:
        device = None
    stored = {} if device is None or force else {
        i: registry.get(shapes[i].op).config_from_dict(winner.config).label()
        for i, winner in stored_winners(shapes, problems, device).items()}
    h_dtype = f", h {residual_dtype}" if residual_dtype else ""
    for i, shape in enumerate(shapes):
        note = f"  (stored: {stored[i]})" if i in stored else ""
        click.echo(f"{shape.describe()}{h_dtype}{note}")
    todo = len(shapes) - len(stored)
    limit = todo * timeout if budget is None else min(budget, todo * timeout)
    where = (f"on {device.name}" if device is not None
             else "(no GPU here: which are stored already is known on the GPU)")
    count = f"{len(shapes)} shape{'s' * (len(shapes) != 1)}"
    click.echo(f"{count}, {todo} to tune {where}: at most {limit:.0f} s of search, plus "
               "compiles and finals")


def _problems(shapes: Sequence[Shape]) -> list[Problem]:
    """Build every shape's problem before any is tuned: a bad one ends the command now."""
    from autonorm.cli_problem import flag_fields

    problems = []
    for shape in shapes:
        # A flag the op's problem has no field for is named as the option it came from.
        flag_fields(shape.op, no_weight=not shape.has_weight, no_bias=not shape.has_bias,
                    weight_offset=shape.weight_offset, residual=shape.residual)
        try:
            problems.append(plan.problem_of(shape))
        except TypeError:
            raise click.UsageError(
                f"op {shape.op} takes no --no-weight, --no-bias, --weight-offset or --residual"
            ) from None
        except ValueError as exc:
            raise click.UsageError(f"{shape.describe()}: {exc}") from None
    return problems


def run_plan(
    *, ops: Sequence[str], hiddens: Sequence[int], dtypes: Sequence[str], rows: Sequence[int],
    configs: Sequence[str], no_weight: bool, no_bias: bool, weight_offset: bool,
    residual: bool | None, default_op: str, default_rows: Any, trials: int, timeout: float,
    seed: int, budget: float | None, force: bool, storage: str | None, workers: int,
    backward: bool = False,
) -> None:
    """Run ``autonorm tune`` with several shapes or a model's config: plan, tune, summarize.

    Raises:
        click.UsageError: a config or option the plan cannot use (one line naming it).
        click.ClickException: no GPU, a shape no kernel runs, or shapes that failed (after
            the summary table).

    """
    from autonorm.cli_messages import INTERRUPTED, fail
    from autonorm.errors import ConfigError
    from autonorm.runtime.device import NoGPUError, query_device

    norms, shapes, problems = _plan(
        ops=ops, hiddens=hiddens, dtypes=dtypes, rows=rows, configs=configs,
        no_weight=no_weight, no_bias=no_bias, weight_offset=weight_offset, residual=residual,
        default_op=default_op, default_rows=default_rows, backward=backward)
    try:
        device = query_device()
    except NoGPUError as exc:
        raise click.ClickException(f"autonorm tune needs a CUDA GPU: {exc}") from None
    for shape, problem in zip(shapes, problems, strict=True):
        try:  # a shape no kernel runs: say so before any other is tuned
            registry.get(shape.op).default(problem, device.limits())
        except ConfigError as exc:
            raise click.ClickException(f"{shape.describe()}: {exc}") from None
    for norm in norms:
        eps = "eps unknown" if norm.eps is None else f"eps {norm.eps:g}"
        scale = ", 1 + weight" if norm.weight_offset else ""
        forms = ""
        if residual is None and any(plan.has_residual_add(o) for o in ops or [norm.op]):
            forms = "; planned plain and after the residual add"
        _say(f"{norm.where}: {norm.op} over hidden {norm.hidden}{scale}, {eps}, "
             f"dtype {norm.dtype or 'not given'}{forms}")
    gpus = worker_gpus(workers)
    results: list[PlanResult] = []
    try:
        settings = TuneSettings(n_trials=trials, timeout_s=timeout, seed=seed)
        with terminate_as_interrupt():  # `kill` and `timeout` end it as Ctrl-C does
            tune_plan(shapes, problems, device, settings=settings, budget=budget, force=force,
                      storage=storage, workers=workers, results=results, gpus=gpus)
    except KeyboardInterrupt:
        print_summary(results)
        fail("interrupted: finished shapes and trials are kept; run the same command to "
             "resume", INTERRUPTED)
    print_summary(results)
    failed = [r for r in results if r.source == FAILED]
    if failed:
        raise click.ClickException(
            f"{len(failed)} of {len(results)} shapes failed: "
            f"{', '.join(r.shape.describe() for r in failed)}")
