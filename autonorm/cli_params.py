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
