"""``autonorm render``: print the CUDA source of one configuration of any kernel family.

LayerNorm's configuration fields are options of their own (``--threads`` ... ``--early``), the
kernels RMSNorm runs too; ``--config`` takes any family's fields as JSON. Fields not given come
from the family's default configuration for an H200.
"""

from __future__ import annotations

import json
from typing import Any

import click

from autonorm.cli_problem import DEFAULT_OP, backward_op, build_problem, problem_options
from autonorm.errors import ConfigError
from autonorm.ops import registry
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


def _int_choice(values: tuple[int, ...]) -> click.Choice:
    return click.Choice([str(v) for v in values])


@click.command()
@problem_options
@click.option("--config", "config_json", default=None, metavar="JSON",
              help='Configuration fields as JSON, e.g. \'{"threads": 128}\' (any op).')
@click.option("--threads", type=_int_choice(THREADS), default=None, help="threads per block")
@click.option("--vec", type=_int_choice(VECS), default=None,
              help="elements per vector load and store")
@click.option("--rows-per-block", type=_int_choice(ROWS_PER_BLOCK), default=None,
              help="rows a block normalizes at once")
@click.option("--cache", type=click.Choice(CACHES), default=None,
              help="where a row waits between statistics and output (bulk: the TMA kernel)")
@click.option("--stats", type=click.Choice(STATS), default=None, help="how mean and variance "
              "are computed")
@click.option("--cluster", type=_int_choice(CLUSTERS), default=None,
              help="blocks of a thread-block cluster that share one row")
@click.option("--blocks-per-sm", type=_int_choice(BLOCKS_PER_SM), default=None,
              help="persistent grid of this many blocks per SM (0: a block per row tile)")
@click.option("--stages", type=_int_choice(STAGES), default=None,
              help="tiles in flight (bulk-copy kernel only; --cache bulk defaults to 2)")
@click.option("--max-regs", type=_int_choice(MAX_REGS), default=None,
              help="registers per thread (0: as the estimate's occupancy allows)")
@click.option("--keep-x/--no-keep-x", default=None,
              help="hint x's loads to stay in L2 (evict_last)")
@click.option("--early/--no-early", default=None, help="load weight and bias beside x")
def render(op: str, backward: bool, hidden: int, dtype: str, no_weight: bool, no_bias: bool,
           weight_offset: bool, residual: bool, residual_dtype: str | None,
           config_json: str | None, **fields: Any) -> None:
    """Print the CUDA source of one configuration.

    Fields not given come from the family's default configuration. The field options
    (--threads ... --early) are those of LayerNorm's kernels, which rms_norm runs too;
    --config takes the fields of any op as JSON.
    """
    from autonorm.runtime.limits import H200

    op = backward_op(op) if backward else op
    problem = build_problem(op, hidden, dtype, no_weight=no_weight, no_bias=no_bias,
                            weight_offset=weight_offset, residual=residual,
                            residual_dtype=residual_dtype)
    family = registry.get(op)
    chosen = {k: (v if k in ("cache", "stats", "keep_x", "early") else int(v))
              for k, v in fields.items() if v is not None}
    runs_ln_kernels = getattr(family, "config_type", None) is KernelConfig
    if chosen and not runs_ln_kernels:
        raise click.UsageError(f"--{next(iter(chosen)).replace('_', '-')} is a {DEFAULT_OP} "
                               f"field; give the fields of {op} with --config")
    chosen.update(_parse_config(config_json))
    try:
        base = family.default(problem, H200).to_dict()
        unknown = sorted(set(chosen) - set(base))
        if unknown:
            raise click.BadParameter(f"{op} has no field {', '.join(unknown)}",
                                     param_hint="--config")
        for name, value in chosen.items():
            _check_field_type(name, value, base[name])
        if runs_ln_kernels and chosen.get("cache") == "bulk":
            # The bulk-copy kernel fixes its statistics and grid; it needs stages.
            base.update(BULK_FIXED, stages=2)
        config = family.config_from_dict({**base, **chosen})
        click.echo(family.render(config, problem, H200).source, nl=False)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


# How --config's errors name the type a field takes.
_TYPE_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _check_field_type(name: str, value: Any, default: Any) -> None:
    """Refuse a field value of another type than its default's (a string for an int, ...)."""
    wanted = type(default)
    if default is None or type(value) is wanted or (wanted is float and type(value) is int):
        return
    raise click.BadParameter(
        f"{name} takes {_TYPE_WORDS.get(wanted, wanted.__name__)} (default "
        f"{json.dumps(default)}), got {json.dumps(value)}", param_hint="--config")


def _parse_config(text: str | None) -> dict[str, Any]:
    """Parse ``--config``: a JSON object of configuration fields."""
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--config") from None
    if not isinstance(value, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--config")
    return value
