"""The ``autonorm`` command line: tune, show, export, render.

Thin: each command parses its options, builds the problem through its family
(:mod:`autonorm.ops.registry`) and calls the library: :func:`autonorm.tune.session.tune_and_store`,
the tuning database, :mod:`autonorm.export` or the family's ``render``. Errors and warnings reach
the user as single lines (:mod:`autonorm.cli_messages`).
"""

from __future__ import annotations

import json
from typing import Any

import click

# First (isort keeps plain imports ahead): exits with a clear message if `import autonorm` found
# a checkout's root, before any import below reads the package's names.
import autonorm.checkout  # noqa: F401
from autonorm import __version__
from autonorm.cli_db import db as db_commands
from autonorm.cli_export import export as export_command
from autonorm.cli_info import info as info_command
from autonorm.cli_messages import INTERRUPTED, MessageGroup, fail
from autonorm.cli_params import DTYPE, OP, finite, tune_options
from autonorm.cli_problem import (
    BACKWARD_OPTION,
    DEFAULT_OP,
    RESIDUAL_DTYPE_OPTION,
    backward_op,
    backward_ops,
    build_problem,
)
from autonorm.cli_render import render as render_command
from autonorm.errors import ConfigError
from autonorm.ops import registry

# Rows tuned for by default: 2^26 elements, a large LLM batch at any hidden size.
DEFAULT_ELEMENTS = 1 << 26


def _default_rows(hidden: int) -> int:
    return max(1, DEFAULT_ELEMENTS // hidden)


@click.group(cls=MessageGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="autonorm")
@click.pass_context
def main(ctx: click.Context) -> None:
    """autonorm: generate, tune and run fast, exact CUDA kernels (LayerNorm and RMSNorm).

    Start with `autonorm tune --hidden 16384` on a GPU, then `autonorm show` and
    `autonorm export`.
    """
    if ctx.invoked_subcommand != "info":  # info lists them among its own lines
        from autonorm import settings

        settings.warn_unknown_variables()


def _quiet_optuna() -> None:
    """Keep Optuna's INFO lines ("A new study created ...") out of the CLI's output.

    Optuna sets its logger to INFO when it is first imported, so this runs after the import:
    setting the "optuna" logger's level before the import is undone by it.
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)


@main.command()
@tune_options
@RESIDUAL_DTYPE_OPTION
@click.option("--trials", type=click.IntRange(min=1), default=40, show_default=True,
              help="Candidates to measure (verified and timed), per shape.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), callback=finite,
              default=45.0, show_default=True, help="Seconds each shape's search may take.")
@click.option("--seed", type=click.IntRange(0, 2**32 - 1), default=0, show_default=True,
              help="Sampler seed.")
@click.option("--storage", default=None,
              help="Optuna storage shared by workers: a journal file path (default: one per "
                   "study in the cache dir), redis://..., or postgresql://...")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Processes searching one shared study, one per local GPU (more than "
                   "the GPUs share them round-robin).")
def tune(
    no_weight: bool, no_bias: bool, weight_offset: bool, residual: bool | None,
    residual_dtype: str | None, configs: tuple[str, ...], budget: float | None, force: bool,
    dry_run: bool, trials: int, timeout: float, seed: int, storage: str | None, workers: int,
    backward: bool, **lists: Any,
) -> None:
    """Tune shapes on this GPU and store the winners.

    One shape (`--hidden 16384`): every candidate is verified against a float64 reference
    before it is timed; a candidate that crashes the GPU is recorded as a failure and the
    search goes on. The winner goes to your tuning database (see `autonorm show`). Re-running
    the same command resumes the study where it stopped.

    A plan: comma lists (`--hidden 4096,5120 --dtype bf16,fp32`) or a model's `--config`
    tune each shape of their product in turn within --budget seconds, skipping those stored
    (unless --force); re-running continues it. A table of the winners ends it. A model's
    RMSNorm is planned twice, plain and after the residual add (`--residual` or `--no-residual`
    keeps one form): inference engines fuse the add into every norm of a decoder but the first.
    """
    flags = {"no_weight": no_weight, "no_bias": no_bias, "weight_offset": weight_offset}
    # --op, --hidden, --dtype, --rows: each given once or more, each time a comma list.
    flat = {name: tuple(v for group in given for v in group) for name, given in lists.items()}
    if backward:
        # A model's config names its norms; --op, where given, replaces them.
        flat["ops"] = backward_ops(flat["ops"] or (() if configs else (DEFAULT_OP,)))
    if not flat["hiddens"] and not configs:
        ctx = click.get_current_context()
        raise click.MissingParameter("Or give a model's --config", ctx=ctx, param=next(
            p for p in ctx.command.params if p.name == "hiddens"))
    if dry_run:
        from autonorm.cli_plan import list_plan

        list_plan(**flat, **flags, residual=residual, residual_dtype=residual_dtype,
                  configs=configs, default_op=DEFAULT_OP, default_rows=_default_rows,
                  timeout=timeout, budget=budget, force=force, backward=backward)
        return
    from autonorm.tune.workers import check_shared_storage

    try:  # before any GPU is asked or study touched
        check_shared_storage(workers, storage)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--storage") from None
    _quiet_optuna()
    if configs or max(map(len, flat.values())) > 1:
        from autonorm.cli_plan import run_plan

        if residual_dtype is not None:
            raise click.UsageError("--residual-dtype tunes one shape at a time: give one "
                                   "--op, --hidden and --dtype, and no --config")
        try:
            run_plan(**flat, **flags, residual=residual, configs=configs, default_op=DEFAULT_OP,
                     default_rows=_default_rows, trials=trials, timeout=timeout, seed=seed,
                     budget=budget, force=force, storage=storage, workers=workers,
                     backward=backward)
        finally:
            _forget_dispatched_kernels()
        return
    _tune_one((flat["ops"] or (DEFAULT_OP,))[0], flat["hiddens"][0],
              (flat["dtypes"] or ("bfloat16",))[0],
              {**flags, "residual": bool(residual), "residual_dtype": residual_dtype},
              (flat["rows"] or (None,))[0], trials,
              timeout if budget is None else min(timeout, budget), seed, storage, workers)


def _tune_one(
    op: str, hidden: int, dtype: str, flags: dict[str, Any], rows: int | None,
    trials: int, timeout: float, seed: int, storage: str | None, workers: int,
) -> None:
    """Tune one shape and print its winner (``autonorm tune --hidden N``)."""
    from autonorm.cli_plan import worker_gpus
    from autonorm.runtime.device import NoGPUError, query_device
    from autonorm.tune import session
    from autonorm.tune.interrupt import terminate_as_interrupt
    from autonorm.tune.search import TuneSettings

    problem = build_problem(op, hidden, dtype, **flags)
    rows = rows or _default_rows(hidden)
    try:
        info = query_device()
    except NoGPUError as exc:
        raise click.ClickException(f"autonorm tune needs a CUDA GPU: {exc}") from None
    try:
        registry.get(op).default(problem, info.limits())  # a shape no kernel runs: say so now
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(
        f"autonorm {__version__}: tuning {op} {problem.describe()}, rows={rows} on "
        f"{info.name} ({info.sm_count} SMs), study {session.study_for(problem, rows, info)}",
        err=True,
    )
    gpus = worker_gpus(workers)
    settings = TuneSettings(n_trials=trials, timeout_s=timeout, seed=seed)
    try:
        with terminate_as_interrupt():  # `kill` and `timeout` end it as Ctrl-C does
            tuned = session.tune_and_store(
                problem, rows, settings=settings, device=info, storage=storage,
                workers=workers, gpus=gpus,
            )
    except KeyboardInterrupt:
        fail("interrupted: finished trials are kept; run the same command to resume",
             INTERRUPTED)
    _forget_dispatched_kernels()
    if not tuned.stored:
        _echo_failed(tuned)
        raise click.ClickException(
            f"no candidate passed verification ({describe_failures(tuned.failures)}); "
            "nothing stored"
        )
    t, kept = tuned.timing, tuned.kept_note
    click.echo(
        f"winner{kept}: {tuned.config.label()}\n"
        f"  {t.median_us:.1f} us  {t.gbps:.0f} GB/s  {t.share * 100:.1f}% of copy bandwidth "
        f"({tuned.metrics['copy_gbps']:.0f} GB/s)  cv {t.cv:.3f}\n"
        f"  {tuned.evaluated} candidates measured ({describe_failures(tuned.failures)}); "
        f"tuned in {tuned.elapsed_s:.1f} s; stored in {tuned.db_path}"
    )
    _echo_failed(tuned)


def _echo_failed(tuned: Any) -> None:
    """Name the first candidates that failed on the GPU, each with its error's first line."""
    from autonorm.tune.failures import describe_failed

    for line in describe_failed(tuned.failed):
        click.echo(f"  {line}", err=True)


def _forget_dispatched_kernels() -> None:
    """Drop this process's dispatch choices, so a call after tuning runs the new winner."""
    from autonorm import dispatch

    dispatch.clear_cache()


def describe_failures(failures: dict[str, int]) -> str:
    """Say what the search skipped and what failed, in words (``TuneResult.failures``)."""
    from autonorm.tune.failures import FAILURE_WORDS

    failed = [f"{n} {FAILURE_WORDS.get(kind, kind)}" for kind, n in failures.items()
              if kind != "invalid" and n]
    parts = []
    if failures.get("invalid"):
        parts.append(f"{failures['invalid']} invalid configurations skipped")
    parts.append(", ".join(failed) if failed else "none failed")
    return "; ".join(parts)


@main.command()
@click.option("--all-devices", is_flag=True, help="Include winners of other GPUs.")
@click.option("--op", type=OP, default=None, help="Only this kernel family (default: all).")
@BACKWARD_OPTION
@click.option("--dtype", type=DTYPE, default=None, help="Only this dtype.")
@click.option("--hidden", type=click.IntRange(min=1), default=None,
              help="Only this hidden size.")
@click.option("--residual/--no-residual", default=None,
              help="Only the norms after a fused residual add (--no-residual: only those "
                   "without; default: both).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def show(all_devices: bool, op: str | None, backward: bool, dtype: str | None,
         hidden: int | None, residual: bool | None, as_json: bool) -> None:
    """List tuned kernels with their time and share of copy bandwidth.

    One line per winner: its GPU, op, shape, rows bucket, configuration label, time, GB/s and
    share of the copy bandwidth. Winners of this GPU only, unless --all-devices; with
    --backward, backward kernels only (of --op's norm where given); with --residual or
    --no-residual, those of the fused add's forms or the plain norm's only.
    """
    from autonorm.cli_show import print_table, winner_record
    from autonorm.runtime.device import NoGPUError, query_device
    from autonorm.store.db import TuningDB

    if backward and op is not None:
        op = backward_op(op)
    device = None
    if not all_devices:
        try:
            device = query_device().fingerprint
        except NoGPUError:
            device = None
    found = []
    # Reading creates nothing: a missing user database has no winners, a read-only one is read.
    for source, opener in (("user", TuningDB.open_user_to_read),
                           ("shipped", TuningDB.open_shipped)):
        store = opener()
        if store is None:
            continue
        with store:
            found.extend((source, w) for w in store.winners(device, op, dtype=dtype)
                         if (not backward or w.key.op.endswith("_backward"))
                         and hidden in (None, w.key.hidden)
                         and residual in (None, bool(w.key.fields.get("residual"))))
    if as_json:
        click.echo(json.dumps([winner_record(s, w) for s, w in found], indent=1))
        return
    if not found:
        click.echo("no tuned kernels yet: run `autonorm tune --hidden N` on a GPU", err=True)
        return
    print_table(found, "all GPUs" if device is None else device)


main.add_command(db_commands)
main.add_command(export_command)
main.add_command(render_command)
main.add_command(info_command)


def run() -> None:
    """Console entry point: every error ends in one line (:class:`MessageGroup`)."""
    main()
