"""How the command line builds a kernel family's problem from the shape options.

``--hidden`` and ``--dtype`` belong to every family; the flags (``--no-weight``, ``--no-bias``,
``--weight-offset``, ``--residual``) each set one field of a problem, and a family whose problem
lacks that field refuses the flag in one line that says so (RMSNorm has no bias, LayerNorm no
weight offset) rather than failing inside the problem's constructor.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import click

from autonorm.cli_params import DTYPE, OP
from autonorm.ops import registry
from autonorm.ops.base import Problem

# The kernel family the commands work on unless --op names another.
DEFAULT_OP = "layer_norm"

# Each flag: the problem field it sets, the value it sets it to, and what the field is in words.
FLAGS: dict[str, tuple[str, bool, str]] = {
    "--no-weight": ("has_weight", False, "weight"),
    "--no-bias": ("has_bias", False, "bias"),
    "--weight-offset": ("weight_offset", True, "weight offset (1 + weight)"),
    "--residual": ("residual", True, "residual add"),
}


# The residual's and h's dtype with --residual: fp32 beside 16-bit x keeps a float32 residual
# stream (default: x's dtype).
RESIDUAL_DTYPE_OPTION = click.option(
    "--residual-dtype", type=DTYPE, default=None,
    help="dtype of the residual and of h with --residual: fp32 beside a 16-bit --dtype keeps "
         "a float32 residual stream (default: --dtype).")


def problem_fields(op: str) -> frozenset[str] | None:
    """Return the field names of ``op``'s problem, or None where the family does not say."""
    problem_type = getattr(registry.get(op), "problem_type", None)
    if problem_type is None or not dataclasses.is_dataclass(problem_type):
        return None
    return frozenset(f.name for f in dataclasses.fields(problem_type))


def _refusal(op: str, flag: str) -> str:
    """Say that ``op`` takes no ``flag``, and which ops do where the registry tells."""
    field, _, words = FLAGS[flag]
    others = [name for name in registry.known()
              if name != op and field in (problem_fields(name) or ())]
    with_it = f" (ops with one: {', '.join(others)})" if others else ""
    return f"op {op} takes no {flag}: its problem has no {words}{with_it}"


def flag_fields(op: str, *, no_weight: bool = False, no_bias: bool = False,
                weight_offset: bool = False, residual: bool = False) -> dict[str, bool]:
    """Return the problem fields the flags given set, each checked against ``op``'s problem.

    Raises:
        click.UsageError: ``op``'s problem has no field for a flag given, or flags that
            contradict each other (one line).

    """
    if no_weight and weight_offset:
        raise click.UsageError("--weight-offset scales by 1 + weight: it cannot go with "
                               "--no-weight")
    given = {"--no-weight": no_weight, "--no-bias": no_bias, "--weight-offset": weight_offset,
             "--residual": residual}
    known = problem_fields(op)
    fields: dict[str, bool] = {}
    for flag, on in given.items():
        if not on:
            continue  # passed only when set: a family without the field still parses
        field, value, _ = FLAGS[flag]
        if known is not None and field not in known:
            raise click.UsageError(_refusal(op, flag))
        fields[field] = value
    return fields


def build_problem(op: str, hidden: int, dtype: str, *, no_weight: bool = False,
                  no_bias: bool = False, weight_offset: bool = False,
                  residual: bool = False, residual_dtype: str | None = None) -> Problem:
    """Build the problem of ``op`` from the shape options.

    Raises:
        click.UsageError: a flag the op's problem has no field for, or a value the problem
            refuses (one line).

    """
    fields: dict[str, Any] = {"hidden": hidden, "dtype": dtype}
    flags: dict[str, Any] = flag_fields(
        op, no_weight=no_weight, no_bias=no_bias, weight_offset=weight_offset, residual=residual)
    if residual_dtype is not None:
        if not residual:
            raise click.UsageError("--residual-dtype is the dtype of the residual add's h: it "
                                   "needs --residual")
        flags["residual_dtype"] = residual_dtype
    try:
        return registry.get(op).problem(**fields, **flags)
    except TypeError:
        # A family whose problem type the registry cannot inspect: name the flags given.
        raise click.UsageError(f"op {op} takes no {' or '.join(_given(flags))}") from None
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def _given(fields: dict[str, bool]) -> list[str]:
    """The flags that set ``fields`` (the options a user typed)."""
    return [flag for flag, (field, _, _) in FLAGS.items() if field in fields] or ["such flag"]


# --backward of the commands that take one op: its backward family instead.
BACKWARD_OPTION = click.option(
    "--backward", is_flag=True,
    help="The op's backward kernel (dx, dweight, dbias): --op layer_norm --backward is op "
         "layer_norm_backward.")


def problem_options(func: Any = None, *, hidden_help: str | None = None) -> Any:
    """The shape options of ``render`` and ``export``: --op, --hidden, --dtype and the flags.

    A decorator, bare or called: ``--hidden`` is required unless ``hidden_help`` says what
    stands for it (export's model config); the command then checks it.
    """
    if func is None:
        return lambda f: problem_options(f, hidden_help=hidden_help)
    options = [
        click.option("--op", type=OP, default=DEFAULT_OP, show_default=True,
                     help="Kernel family."),
        BACKWARD_OPTION,
        click.option("--hidden", type=click.IntRange(min=1), required=hidden_help is None,
                     help=hidden_help or "Hidden size (row length)."),
        click.option("--dtype", type=DTYPE, default="bfloat16", show_default=True,
                     help="dtype of the tensors: bf16, fp16 or fp32."),
        click.option("--no-weight", is_flag=True, help="Problem without a weight."),
        click.option("--no-bias", is_flag=True, help="Problem without a bias (layer_norm)."),
        click.option("--weight-offset", is_flag=True,
                     help="Scale by 1 + weight, Gemma's RMSNorm (rms_norm)."),
        click.option("--residual", is_flag=True,
                     help="Add a residual first and normalize the sum, which the kernel stores "
                          "too."),
        RESIDUAL_DTYPE_OPTION,
    ]
    for option in reversed(options):
        func = option(func)
    return func


def backward_op(op: str) -> str:
    """Return the backward family of ``op`` (``--backward``): ``layer_norm_backward``, ...

    Raises:
        click.UsageError: ``op`` has no backward family (one line naming those that do).
    """
    known = registry.known()
    name = op if op.endswith("_backward") else f"{op}_backward"
    if name not in known:
        raise click.UsageError(f"op {op} has no backward kernels (ops with them: "
                               f"{', '.join(k for k in known if k.endswith('_backward'))})")
    return name


def backward_ops(ops: tuple[str, ...]) -> tuple[str, ...]:
    """Return the backward family of each op (``--backward``) of ``autonorm tune``.

    Raises:
        click.UsageError: an op has no backward family.
    """
    return tuple(backward_op(op) for op in ops)
