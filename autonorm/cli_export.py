"""``autonorm export``: tuned kernels as standalone CUDA, for one shape or a model's norms.

One shape (``--hidden``) gives its kernel; a model's ``--config`` gives the kernel of each norm
shape ``autonorm tune --config`` plans for it (a RMSNorm model's norms plain and after the
residual add), so a model tuned with ``--config`` exports with the same file. Each kernel is
the winner of the user's database, then the shipped one, else the family's default (with a
warning); no GPU is needed.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
from click.core import ParameterSource

from autonorm.cli_params import ARCH, MAX_ROWS
from autonorm.cli_problem import backward_op, build_problem, problem_options
from autonorm.errors import ConfigError
from autonorm.ops.base import Problem


def _given(ctx: click.Context, name: str) -> bool:
    """Whether option ``name`` was given (on the command line or by the environment)."""
    return ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None)


def _model_problems(ctx: click.Context, configs: tuple[str, ...], op: str, hidden: int | None,
                    dtype: str, flags: dict[str, bool], backward: bool) -> list[Problem]:
    """The problems of the norm shapes a model's configs plan, in plan order, each once.

    ``--op``, ``--hidden`` and ``--dtype`` replace what a config says where given;
    ``--residual`` keeps the form after the add alone (without it both forms of a norm whose
    op has the add, as ``autonorm tune --config`` plans them). With ``backward``, the backward
    of each norm (:func:`autonorm.tune.model_config.backward_norms`).
    """
    from autonorm.tune import model_config, plan

    try:
        norms = model_config.read_norms(configs, op=op if _given(ctx, "op") else None,
                                        backward=backward)
        if backward:
            op = backward_op(op)
        shapes = plan.expand(
            ops=[op] if _given(ctx, "op") else [], hiddens=[hidden] if hidden else [],
            dtypes=[dtype] if _given(ctx, "dtype") else [], rows=[1],
            default_rows=lambda _: 1, norms=norms, has_weight=not flags["no_weight"],
            has_bias=not flags["no_bias"], weight_offset=flags["weight_offset"],
            residual=True if flags["residual"] else None)
    except model_config.PlanError as exc:
        raise click.BadParameter(str(exc), param_hint=exc.option) from None
    problems: list[Problem] = []
    for shape in shapes:
        problem = build_problem(shape.op, shape.hidden, shape.dtype,
                                no_weight=not shape.has_weight, no_bias=not shape.has_bias,
                                weight_offset=shape.weight_offset, residual=shape.residual)
        if problem not in problems:
            problems.append(problem)
    return problems


@click.command()
@problem_options(hidden_help="Hidden size (row length); required without --config.")
@click.option("--config", "configs", multiple=True, metavar="CONFIG_JSON",
              type=click.Path(dir_okay=False),
              help="A model's Hugging Face style config.json: export the kernel of each of its "
                   "norms' shapes, as `autonorm tune --config` plans them; --op/--hidden/"
                   "--dtype replace what it says.")
@click.option("--rows", type=click.IntRange(1, MAX_ROWS), default=None,
              help="Pick the winner tuned for this row count.")
@click.option("--arch", type=ARCH, default=None, metavar="sm_XX",
              help="Export for this kind of GPU (sm_75, sm_80, sm_86, sm_89, sm_90, sm_100, "
                   "sm_120): its winners, or the default kernel for it. Default: the GPU the "
                   "winner was tuned on.")
@click.option("-o", "--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              required=True, help="Directory to write the .cu, .h and .json into.")
@click.pass_context
def export(ctx: click.Context, op: str, backward: bool, hidden: int | None, dtype: str,
           no_weight: bool, no_bias: bool, weight_offset: bool, residual: bool,
           residual_dtype: str | None, configs: tuple[str, ...], rows: int | None,
           arch: int | None, out_dir: Path) -> None:
    """Write tuned kernels as standalone CUDA with a host launcher.

    Each winner comes from your tuning database, then the shipped one; without one, the
    family's untuned default is exported (with a warning). Prints the paths written, then
    (on stderr) what each holds and the GPUs its source needs.
    """
    flags = {"no_weight": no_weight, "no_bias": no_bias, "weight_offset": weight_offset,
             "residual": residual}
    if configs:
        if residual_dtype is not None:
            raise click.UsageError("--residual-dtype exports one shape: give --op, --hidden "
                                   "and --dtype, and no --config")
        problems = _model_problems(ctx, configs, op, hidden, dtype, flags, backward)
    else:
        if hidden is None:
            raise click.MissingParameter("Or give a model's --config", ctx=ctx, param=next(
                p for p in ctx.command.params if p.name == "hidden"))
        op = backward_op(op) if backward else op
        problems = [build_problem(op, hidden, dtype, **flags, residual_dtype=residual_dtype)]
    for problem in problems:
        _export_one(problem, out_dir, rows, arch)


def _export_one(problem: Problem, out_dir: Path, rows: int | None, arch: int | None) -> None:
    """Export one problem's kernel; print its paths (stdout) and what it holds (stderr)."""
    from autonorm import export as export_mod
    from autonorm.cli_show import describe_export

    try:
        paths = export_mod.export_tuned(problem, out_dir, rows=rows, arch=arch)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(
            f"cannot write the export into {out_dir}: {exc.strerror or exc}"
        ) from None
    for path in paths:
        click.echo(str(path))
    # What the files hold, for a person (stderr: stdout stays the list of paths for scripts).
    manifest = json.loads(next(p for p in paths if p.suffix == ".json").read_text())
    click.echo(describe_export(manifest), err=True)
