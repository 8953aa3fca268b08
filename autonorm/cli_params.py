"""The parameter types of the ``autonorm`` command line: dtypes, ops, GPU architectures."""

from __future__ import annotations

from typing import Any

import click

from autonorm.dtypes import normalize_dtype
from autonorm.ops import registry

# The most rows a kernel takes: its row index is a 32-bit int.
MAX_ROWS = 2**31 - 1


class DtypeParam(click.ParamType):
    """A dtype name or alias (bf16, fp16, fp32, ...)."""

    name = "dtype"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:  # noqa: D102
        try:
            return normalize_dtype(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class OpParam(click.ParamType):
    """A kernel family's op name, checked against the registry when the command runs.

    Not a fixed ``click.Choice``: a family registered after this module is imported (a plug-in,
    a test) is a valid choice too.
    """

    name = "op"

    def get_metavar(self, param: Any, *args: Any, **kwargs: Any) -> str:  # noqa: D102
        return "[" + "|".join(registry.known()) + "]"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:  # noqa: D102
        if value not in registry.known():
            self.fail(f"{value!r} is not a known op ({', '.join(registry.known())})", param, ctx)
        return value


class ArchParam(click.ParamType):
    """A GPU architecture, ``sm_80``, ``sm_90``, ``sm_100`` (or 80, 9.0): its compute capability."""

    name = "arch"

    def convert(self, value: Any, param: Any, ctx: Any) -> int:  # noqa: D102
        from autonorm.export.arch import parse_arch  # (the export package loads only if used)

        if isinstance(value, int):
            return value
        try:
            return parse_arch(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def finite(ctx: Any, param: Any, value: float) -> float:
    """Refuse NaN, which every range test lets through."""
    if value != value:
        raise click.BadParameter("nan is not a number of seconds", ctx, param)
    return value


DTYPE = DtypeParam()

OP = OpParam()

ARCH = ArchParam()


class ListParam(click.ParamType):
    """A comma-separated list of another type's values, ``4096,5120``: a tuple of them.

    Each item is converted by the item type with this option as its parameter, so a bad item
    fails as a single value would (``'--hidden': 'abc' is not a valid integer``).
    """

    def __init__(self, item: click.ParamType) -> None:
        self.item = item
        self.name = f"{item.name} list"

    def get_metavar(self, param: Any, *args: Any, **kwargs: Any) -> str | None:  # noqa: D102
        metavar = self.item.get_metavar(param, *args, **kwargs)
        return None if metavar is None else f"{metavar},..."

    def convert(self, value: Any, param: Any, ctx: Any) -> tuple[Any, ...]:  # noqa: D102
        if isinstance(value, tuple):
            return value
        return tuple(self.item.convert(part.strip(), param, ctx) for part in str(value).split(","))


def tune_options(func: Any) -> Any:
    """The shape and plan options of ``autonorm tune`` (each shape option takes a list)."""
    options = [
        click.option("--op", "ops", type=ListParam(OP), multiple=True,
                     help="Kernel families, e.g. layer_norm,rms_norm (default: layer_norm, or "
                          "the config's norm)."),
        click.option("--backward", is_flag=True,
                     help="Tune the ops' backward kernels (dx, dweight, dbias): "
                          "--op layer_norm --backward is op layer_norm_backward; with a "
                          "--config, its norms' backward."),
        click.option("--hidden", "hiddens", type=ListParam(click.IntRange(min=1)),
                     multiple=True, metavar="N[,N...]",
                     help="Hidden sizes (row lengths), e.g. 4096,5120."),
        click.option("--dtype", "dtypes", type=ListParam(DTYPE), multiple=True,
                     metavar="DTYPE[,DTYPE...]",
                     help="dtypes: bf16, fp16, fp32 (default: the config's, else bf16)."),
        click.option("--no-weight", is_flag=True, help="Problems without a weight."),
        click.option("--no-bias", is_flag=True, help="Problems without a bias (layer_norm)."),
        click.option("--weight-offset", is_flag=True,
                     help="Problems scaled by 1 + weight, Gemma's RMSNorm (rms_norm; a Gemma "
                          "config sets it)."),
        click.option("--residual/--no-residual", default=None,
                     help="Problems that add a residual first and normalize the sum, or "
                          "without it. Default: without, but a model's RMSNorm config plans "
                          "both."),
        click.option("--rows", "rows", type=ListParam(click.IntRange(1, MAX_ROWS)),
                     multiple=True, metavar="N[,N...]",
                     help="Rows to tune for (each power-of-two bucket keys a winner). "
                          "Default: 2^26 / hidden."),
        click.option("--config", "configs", multiple=True, metavar="CONFIG_JSON",
                     type=click.Path(dir_okay=False),
                     help="A model's Hugging Face style config.json: tune its norms' shapes "
                          "(hidden size, torch_dtype, norm); --op/--hidden/--dtype replace "
                          "what it says."),
        click.option("--budget", type=click.FloatRange(min=0, min_open=True), callback=finite,
                     default=None, metavar="SECONDS",
                     help="Total seconds for a plan of several shapes, split across the "
                          "shapes left; --timeout still caps each."),
        click.option("--force", is_flag=True,
                     help="Tune a plan's shapes that already have a winner too."),
        click.option("--dry-run", is_flag=True,
                     help="List the shapes the command would tune (on a GPU, which are stored "
                          "already), then exit: nothing is tuned, no GPU is needed."),
    ]
    for option in reversed(options):
        func = option(func)
    return func
