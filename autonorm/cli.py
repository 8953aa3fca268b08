"""The ``autonorm`` command line: tune, show, export, render."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from autonorm import __version__
from autonorm.dtypes import SHORT_DTYPES, normalize_dtype
from autonorm.errors import AutonormError, ConfigError
from autonorm.ops.base import rows_bucket
from autonorm.ops.layer_norm.config import (
    BLOCKS_PER_SM,
    BULK_FIXED,
    CACHES,
    CLUSTERS,
    MAX_REGS,
    ROWS_PER_BLOCK,
    STAGES,
    STATS,
    THREADS,
    VECS,
    KernelConfig,
)
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.space import default_config, seed_configs

DEFAULT_ELEMENTS = 1 << 26


class DtypeParam(click.ParamType):
    """A dtype name or alias (bf16, fp16, fp32, ...)."""

    name = "dtype"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:  # noqa: D102
        try:
            return normalize_dtype(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


DTYPE = DtypeParam()


def _problem(hidden: int, dtype: str, weight: bool, bias: bool) -> Problem:
    if hidden < 1:
        raise click.BadParameter(
            f"hidden size must be at least 1, got {hidden}", param_hint="--hidden"
        )
    return Problem(hidden, dtype, weight, bias)


def _default_rows(hidden: int) -> int:
    return max(1, DEFAULT_ELEMENTS // hidden)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="autonorm")
def main() -> None:
    """autonorm: generate, tune and run fast, exact CUDA LayerNorm kernels."""


def _quiet_optuna() -> None:
    """Keep Optuna's INFO lines ("A new study created ...") out of the CLI's output.

    Optuna sets its logger to INFO when it is first imported, so this runs after the import
    (setting the "optuna" logger's level before it was undone: the line showed on the H200).
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)


def _common_problem_options(func: Any) -> Any:
    func = click.option("--no-bias", is_flag=True, help="Problem without a bias.")(func)
    func = click.option("--no-weight", is_flag=True, help="Problem without a weight.")(func)
    func = click.option(
        "--dtype", type=DTYPE, default="bfloat16", show_default=True,
        help="dtype of x, y, weight and bias: bf16, fp16 or fp32.",
    )(func)
    func = click.option("--hidden", type=int, required=True, help="Hidden size (row length).")(func)
    return func


def _tune_worker(index: int, spec: dict[str, Any]) -> None:
    """Entry point of one `--workers` process (module level so spawn can import it)."""
    from autonorm.tune import tuner

    _quiet_optuna()
    problem = Problem(**spec["problem"])
    _, evaluator, limits, on_trial, db = _tuning_parts(problem, spec["rows"], quiet=True)
    try:
        tuner.tune(
            problem, evaluator, limits=limits, storage=spec["storage"],
            study_name=spec["study"], settings=tuner.TuneSettings(**spec["settings"],
                                                                  finals_top=0),
            on_trial=on_trial, progress=index == 0, worker_index=index,
            # Worker 0 enqueues them into the new shared study; the parent's own call after
            # the workers finds trials there and enqueues nothing.
            seeds=seed_configs(problem, limits, spec["rows"]),
        )
    finally:
        db.close()
        if evaluator.pool is not None:
            evaluator.pool.close()


def _tuning_parts(problem: Problem, rows: int, quiet: bool = False) -> tuple[Any, ...]:
    """Build (device info, evaluator, limits, on_trial callback, user DB) for this process."""
    from autonorm.ops import layer_norm as codegen
    from autonorm.runtime.device import query_device
    from autonorm.store import db
    from autonorm.tune.isolation import IsolatedEvaluator, build_gpu_evaluator

    info = query_device()
    store = db.TuningDB.open_user()
    store.record_device(info)
    key = db.TuningKey.for_problem(info.fingerprint, codegen.code_version(), problem, rows)
    evaluator = IsolatedEvaluator(build_gpu_evaluator, (problem, rows))

    def on_trial(config: KernelConfig, outcome: Any, number: int) -> None:
        store.record_outcome(key, config, outcome, trial_number=number)

    return key, evaluator, info.limits(), on_trial, store


@main.command()
@_common_problem_options
@click.option("--rows", type=int, default=None,
              help="Rows to tune for (its power-of-two bucket is the DB key). "
                   "Default: 2^26 / hidden.")
@click.option("--trials", type=int, default=40, show_default=True,
              help="Candidates to measure (verified and timed).")
@click.option("--timeout", type=float, default=45.0, show_default=True,
              help="Stop the search after this many seconds.")
@click.option("--seed", type=int, default=0, show_default=True, help="Sampler seed.")
@click.option("--storage", default=None,
              help="Optuna storage shared by workers: a journal file path (default: one per "
                   "study in the cache dir), redis://..., or postgresql://...")
@click.option("--workers", type=int, default=1, show_default=True,
              help="Processes, one per local GPU, searching one shared study.")
def tune(
    hidden: int, dtype: str, no_weight: bool, no_bias: bool, rows: int | None, trials: int,
    timeout: float, seed: int, storage: str | None, workers: int,
) -> None:
    """Search the kernel space for one shape on this GPU and store the winner.

    Every candidate is verified against a float64 reference before it is timed. Re-running
    the same command resumes the study where it stopped.
    """
    from autonorm import dispatch
    from autonorm.runtime.device import NoGPUError, query_device
    from autonorm.tune import tuner

    _quiet_optuna()
    problem = _problem(hidden, dtype, not no_weight, not no_bias)
    rows = rows or _default_rows(hidden)
    if rows < 1:
        raise click.BadParameter("rows must be at least 1", param_hint="--rows")
    if trials < 1 or timeout <= 0 or workers < 1:
        raise click.UsageError("--trials and --workers must be >= 1 and --timeout > 0")
    started = time.monotonic()
    try:
        info = query_device()
    except NoGPUError as exc:
        raise click.ClickException(f"autonorm tune needs a CUDA GPU: {exc}") from None
    from autonorm.ops import layer_norm as codegen

    study = tuner.study_name_for(info.fingerprint, codegen.code_version(), problem,
                                 rows_bucket(rows))
    settings = {"n_trials": trials, "timeout_s": timeout, "seed": seed}
    click.echo(
        f"autonorm {__version__}: tuning hidden={hidden} {problem.dtype} rows={rows} on "
        f"{info.name} ({info.sm_count} SMs), study {study}", err=True,
    )
    key, evaluator, limits, on_trial, store = _tuning_parts(problem, rows)
    try:
        if workers > 1:
            spec = {"problem": problem.__dict__, "rows": rows, "storage": storage,
                    "study": study, "settings": settings}
            codes = tuner.run_workers(workers, _tune_worker, (spec,), storage_url=storage)
            if any(codes):
                click.echo(f"warning: worker exit codes {codes}", err=True)
        incumbent_rec = store.get_winner(key)
        incumbent = KernelConfig.from_dict(incumbent_rec.config) if incumbent_rec else None
        result = tuner.tune(
            problem, evaluator, limits=limits, storage=storage, study_name=study,
            settings=tuner.TuneSettings(**settings), incumbent=incumbent, on_trial=on_trial,
            seeds=seed_configs(problem, limits, rows),
        )
        if result.best is None or result.timing is None:
            raise click.ClickException(
                f"no candidate passed verification ({describe_failures(result.failures)}); "
                "nothing stored"
            )
        t = result.timing
        copy_gbps = t.copy_gbps or evaluator.copy_gbps
        metrics = t.metrics(rows=rows, trials=result.evaluated, copy_gbps=copy_gbps)
        store.set_winner(key, result.best.to_dict(), metrics)
    except KeyboardInterrupt:
        click.echo("interrupted: finished trials are kept; run the same command to resume",
                   err=True)
        sys.exit(130)
    finally:
        store.close()
        if evaluator.pool is not None:
            evaluator.pool.close()
    dispatch.clear_cache()
    elapsed = time.monotonic() - started
    kept = " (incumbent kept)" if result.incumbent_kept else ""
    click.echo(
        f"winner{kept}: {result.best.label()}\n"
        f"  {t.median_us:.1f} us  {t.gbps:.0f} GB/s  {t.share * 100:.1f}% of copy bandwidth "
        f"({copy_gbps:.0f} GB/s)  cv {t.cv:.3f}\n"
        f"  {result.evaluated} candidates measured ({describe_failures(result.failures)}); "
        f"tuned in {elapsed:.1f} s; stored in {store_path()}"
    )


def describe_failures(failures: dict[str, int]) -> str:
    """Say what the search skipped and what failed, in words (tuner.TuneResult.failures)."""
    words = {"compile": "failed to compile", "launch": "failed at launch",
             "verification": "failed verification"}
    failed = [f"{n} {words.get(kind, kind)}" for kind, n in failures.items()
              if kind != "invalid" and n]
    parts = []
    if failures.get("invalid"):
        parts.append(f"{failures['invalid']} invalid configurations skipped")
    parts.append(", ".join(failed) if failed else "none failed")
    return "; ".join(parts)


def store_path() -> Path:
    """Path of the user's tuning DB (for messages)."""
    from autonorm import settings as config

    return config.user_db_path()


@main.command()
@click.option("--all-devices", is_flag=True, help="Include winners of other GPUs.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def show(all_devices: bool, as_json: bool) -> None:
    """List tuned kernels: shape, configuration, time, GB/s and share of copy bandwidth."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    from autonorm.runtime.device import NoGPUError, query_device
    from autonorm.store import db

    device = None
    if not all_devices:
        try:
            device = query_device().fingerprint
        except NoGPUError:
            device = None
    rows = []
    stores = [("user", db.TuningDB.open_user()), ("shipped", db.TuningDB.open_shipped())]
    for source, store in stores:
        if store is None:
            continue
        with store:
            for w in store.winners(device):
                rows.append((source, w))
    if as_json:
        click.echo(json.dumps([
            {"source": s, **w.key.__dict__, "config": w.config, "metrics": w.metrics}
            for s, w in rows
        ], indent=1))
        return
    table = Table(title=f"autonorm tuned kernels ({'all GPUs' if device is None else device})",
                  box=box.SIMPLE_HEAD)
    for col in ("source", "GPU", "dtype", "hidden", "w/b", "rows<=", "config", "us", "GB/s",
                "% copy"):
        # The config label is what a user copies into `render` or `export`: never cut it.
        table.add_column(col, justify="right" if col in ("hidden", "rows<=", "us", "GB/s",
                                                         "% copy") else "left",
                         no_wrap=True, min_width=len(col) if col != "config" else 32)
    for source, w in rows:
        m = w.metrics
        table.add_row(
            source, w.key.device.split("|")[0].removeprefix("NVIDIA "),
            SHORT_DTYPES.get(w.key.dtype, w.key.dtype), str(w.key.hidden),
            f"{'w' if w.key.has_weight else '-'}{'b' if w.key.has_bias else '-'}",
            str(w.key.rows_bucket), KernelConfig.from_dict(w.config).label(),
            f"{m.get('median_us', 0):.1f}", f"{m.get('gbps', 0):.0f}",
            f"{m.get('share', 0) * 100:.1f}",
        )
    if not rows:
        click.echo("no tuned kernels yet: run `autonorm tune --hidden N` on a GPU", err=True)
        return
    console = Console()
    if not console.is_terminal:
        # Piped or redirected: whole rows rather than a table folded to 80 columns.
        console = Console(width=max(console.width, 132))
    console.print(table)


@main.command()
@_common_problem_options
@click.option("--rows", type=int, default=None, help="Pick the winner tuned for this row count.")
@click.option("-o", "--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              required=True, help="Directory to write the .cu, .h and .json into.")
def export(hidden: int, dtype: str, no_weight: bool, no_bias: bool, rows: int | None,
           out_dir: Path) -> None:
    """Write a tuned kernel as standalone CUDA source with a host launcher."""
    from autonorm import export as export_mod

    _problem(hidden, dtype, not no_weight, not no_bias)
    paths = export_mod.export_from_db(
        hidden, dtype, out_dir, has_weight=not no_weight, has_bias=not no_bias, rows=rows
    )
    for path in paths:
        click.echo(str(path))
    # What the files hold, for a person (stderr: stdout stays the list of paths for scripts).
    manifest = json.loads(next(p for p in paths if p.suffix == ".json").read_text())
    extra = (f"; {manifest['function_with_workspace']}() takes a workspace of "
             f"{manifest['workspace_bytes']} bytes for the dynamic tile schedule (see the header)"
             if manifest["workspace_bytes"] else "")
    click.echo(f"{manifest['label']} ({manifest['source']}): {manifest['function']}(){extra}",
               err=True)


@main.command()
@_common_problem_options
@click.option("--threads", type=click.Choice([str(t) for t in THREADS]), default=None)
@click.option("--vec", type=click.Choice([str(v) for v in VECS]), default=None)
@click.option("--rows-per-block", type=click.Choice([str(r) for r in ROWS_PER_BLOCK]),
              default=None)
@click.option("--cache", type=click.Choice(CACHES), default=None)
@click.option("--stats", type=click.Choice(STATS), default=None)
@click.option("--cluster", type=click.Choice([str(c) for c in CLUSTERS]), default=None)
@click.option("--blocks-per-sm", type=click.Choice([str(b) for b in BLOCKS_PER_SM]),
              default=None)
@click.option("--stages", type=click.Choice([str(s) for s in STAGES]), default=None,
              help="tiles in flight (bulk-copy kernel only; --cache bulk defaults to 2)")
@click.option("--max-regs", type=click.Choice([str(m) for m in MAX_REGS]), default=None,
              help="registers per thread (0: as the estimate's occupancy allows)")
@click.option("--keep-x/--no-keep-x", default=None,
              help="hint x's loads to stay in L2 (evict_last)")
def render(hidden: int, dtype: str, no_weight: bool, no_bias: bool, **fields: Any) -> None:
    """Print the CUDA source of one configuration (unset fields come from the default)."""
    from autonorm.ops import layer_norm as codegen

    problem = _problem(hidden, dtype, not no_weight, not no_bias)
    base = default_config(problem).to_dict()
    chosen = {k: (int(v) if k not in ("cache", "stats", "keep_x") else v)
              for k, v in fields.items() if v is not None}
    if chosen.get("cache") == "bulk":
        # The bulk-copy kernel fixes its statistics and grid; it needs stages.
        base.update(BULK_FIXED, stages=2)
    config = KernelConfig.from_dict({**base, **chosen})
    try:
        click.echo(codegen.render(config, problem).source, nl=False)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


def run() -> None:
    """Console entry point with autonorm errors shown as one clear line."""
    try:
        main(standalone_mode=True)
    except AutonormError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
