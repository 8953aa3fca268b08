"""The plan of ``autonorm tune``: which shapes to tune, in what order and with how much time.

A plan is the cartesian product of the shape options (ops, hidden sizes, dtypes, row counts)
or the norms a model's Hugging Face style ``config.json`` describes, deduplicated by tuning key
and sorted. The command tunes the shapes one after another, splitting a total time budget
across the shapes still to tune, and skips shapes whose exact rows bucket already holds a usable
winner, so re-running a plan continues where it stopped (docs/tuning.md, "Tuning a model").

A model's norm of an op with the fused residual add (RMSNorm) is planned in both forms, plain and
after the add: every norm of a transformer but its first normalizes a residual sum, which
inference engines (vLLM's and flashinfer's ``fused_add_rms_norm``, ``autonorm.add_rms_norm``)
fuse into the norm's kernel, while a model's own modules run the plain norm. It doubles the
shapes of such a model, each still searched within ``--timeout`` (and ``--budget``).

Pure logic: no GPU, no Optuna.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import product
from typing import Any

from autonorm import lookup
from autonorm.dtypes import SHORT_DTYPES
from autonorm.ops.base import Problem, rows_bucket
from autonorm.ops.registry import get as family_named
from autonorm.runtime.limits import DeviceLimits
from autonorm.store.db import TuningDB
from autonorm.store.keys import TuningKey, Winner
from autonorm.tune.model_config import ModelNorm, PlanError

# The order dtypes take in a plan: the default dtype first, then by size.
_DTYPE_ORDER = {name: i for i, name in enumerate(("bfloat16", "float16", "float32"))}

# The least search time worth starting a shape with: a share below it would time out before
# its first batch of candidates is compiled, so the budget counts as spent.
MIN_SHAPE_S = 1.0


@dataclass(frozen=True)
class Shape:
    """One entry of a plan: a problem of an op at a row count."""

    op: str
    hidden: int
    dtype: str
    rows: int
    has_weight: bool = True
    has_bias: bool = True
    weight_offset: bool = False
    residual: bool = False

    @property
    def identity(self) -> tuple[Any, ...]:
        """What keys its winner: shapes of one rows bucket share it."""
        return (self.op, self.hidden, self.dtype, rows_bucket(self.rows), self.has_weight,
                self.has_bias, self.weight_offset, self.residual)

    def describe(self) -> str:
        """Return e.g. ``layer_norm bf16 hidden 4096 rows 16384`` (flags only when not default).

        A shape without a weight or bias says ``no weight``, ``no bias``; one that scales by
        1 + weight says ``1 + weight``; one that adds a residual first says ``residual add``.
        """
        flags = "".join(f" no {name}" for name, on in (("weight", self.has_weight),
                                                      ("bias", self.has_bias)) if not on)
        flags += " 1 + weight" if self.weight_offset else ""
        flags += " residual add" if self.residual else ""
        return (f"{self.op} {SHORT_DTYPES.get(self.dtype, self.dtype)} hidden {self.hidden} "
                f"rows {self.rows}{flags}")


def _sort_key(shape: Shape) -> tuple[Any, ...]:
    return (shape.op, shape.hidden, _DTYPE_ORDER.get(shape.dtype, len(_DTYPE_ORDER)),
            rows_bucket(shape.rows), not shape.has_weight, not shape.has_bias,
            shape.weight_offset, shape.residual)


def order(shapes: Iterable[Shape]) -> list[Shape]:
    """Deduplicate ``shapes`` by tuning key (the first of a bucket stays) and sort them.

    The order depends on the shapes only, not on how the options listed them, so a plan
    written another way resumes the same.
    """
    seen: dict[tuple[Any, ...], Shape] = {}
    for shape in shapes:
        seen.setdefault(shape.identity, shape)
    return sorted(seen.values(), key=_sort_key)


def expand(
    *,
    ops: Sequence[str],
    hiddens: Sequence[int],
    dtypes: Sequence[str],
    rows: Sequence[int],
    default_rows: Callable[[int], int],
    norms: Sequence[ModelNorm] = (),
    has_weight: bool = True,
    has_bias: bool = True,
    weight_offset: bool = False,
    residual: bool | None = None,
    default_op: str = "layer_norm",
    default_dtype: str = "bfloat16",
) -> list[Shape]:
    """Expand the shape options and model norms into an ordered, deduplicated plan.

    Without ``norms``, the plan is the product of the lists (an empty list takes the default).
    With them, each norm gives its op, hidden size and dtype, and a list given on the command
    line replaces the norm's value.

    Args:
        ops: the ops given (``--op``; empty: not given, as for the other lists).
        hiddens: the hidden sizes given.
        dtypes: the dtypes given (canonical names).
        rows: the row counts given.
        default_rows: the row count of a hidden size when ``rows`` is empty.
        norms: the norms of the model configs given.
        has_weight: every shape has a weight.
        has_bias: every shape has a bias.
        weight_offset: every shape scales by 1 + weight (``--weight-offset``); without it, the
            shapes of a norm that does (a Gemma config's) still do, unless they have no weight.
        residual: every shape adds a residual first (True) or none does (False); None: the
            shapes of a norm whose op has the residual add (:func:`has_residual_add`) come in
            both forms, the others plain.
        default_op: the op when neither ``ops`` nor a norm names one.
        default_dtype: the dtype when neither ``dtypes`` nor a norm names one.

    Raises:
        PlanError: no hidden size (neither ``hiddens`` nor ``norms``).

    """
    sources = [(ops or [n.op], hiddens or [n.hidden], dtypes or [n.dtype or default_dtype],
                weight_offset or (n.weight_offset and has_weight)) for n in norms]
    if not norms:
        if not hiddens:
            raise PlanError("--hidden", "give a hidden size (or a model's --config)")
        sources = [(ops or [default_op], hiddens, dtypes or [default_dtype], weight_offset)]
    shapes = []
    for op_list, hidden_list, dtype_list, offset in sources:
        for op, hidden, dtype in product(op_list, hidden_list, dtype_list):
            if residual is not None:
                forms = [residual]
            else:  # a model's norm of an op with the add: plain and fused (module docstring)
                forms = [False, True] if norms and has_residual_add(op) else [False]
            for count, added in product(rows or [default_rows(hidden)], forms):
                shapes.append(Shape(op, hidden, dtype, count, has_weight, has_bias, offset,
                                    added))
    return order(shapes)


def has_residual_add(op: str) -> bool:
    """Whether a model's norms of ``op`` are planned after the fused residual add too.

    That is where the op's problem has the add (a ``residual`` field) and says that inference
    engines fuse it into the model's norms (its ``engines_fuse_residual``: RMSNorm's).
    LayerNorm has the add for those who ask (``--residual``); a model's plan keeps it plain.
    False for an op that is not registered: the plan names it when its problem is built.
    """
    try:
        problem_type = getattr(family_named(op), "problem_type", None)
    except KeyError:
        return False
    return (problem_type is not None and dataclasses.is_dataclass(problem_type)
            and any(f.name == "residual" for f in dataclasses.fields(problem_type))
            and bool(getattr(problem_type, "engines_fuse_residual", False)))



def problem_of(shape: Shape) -> Problem:
    """Build the problem of a shape through its family (the flags only when not default).

    Raises:
        KeyError: the op is not registered.
        TypeError: the family's problem has no weight, bias, weight offset or residual flag.
        ValueError: the family refuses the hidden size, dtype or flags.

    """
    fields: dict[str, Any] = {"hidden": shape.hidden, "dtype": shape.dtype}
    if not shape.has_weight:
        fields["has_weight"] = False
    if not shape.has_bias:
        fields["has_bias"] = False
    if shape.weight_offset:
        fields["weight_offset"] = True
    if shape.residual:
        fields["residual"] = True
    return family_named(shape.op).problem(**fields)


def shape_timeout(timeout: float, budget: float | None, spent: float, remaining: int
                  ) -> float | None:
    """Return the search seconds of the next shape: its share of the budget left.

    Args:
        timeout: the cap of one shape's search (``--timeout``).
        budget: the plan's total seconds (``--budget``); None: no budget, each shape gets
            ``timeout``.
        spent: seconds the plan has run so far.
        remaining: shapes left to tune, the next one included.

    Returns:
        ``min(timeout, (budget - spent) / remaining)``, or None when the budget is spent (the
        share is below :data:`MIN_SHAPE_S`).

    """
    if budget is None:
        return timeout
    if remaining < 1:
        return None
    share = (budget - spent) / remaining
    return None if share < MIN_SHAPE_S else min(timeout, share)


def usable_winner(store: TuningDB | None, device: str, shape: Shape, problem: Problem,
                  limits: DeviceLimits) -> Winner | None:
    """Return the winner stored for the shape's exact rows bucket if it may still run.

    A winner the family's rules now refuse, or whose configuration renders another kernel than
    the one that was timed, is no reason to skip the shape (:func:`autonorm.lookup.verdict`).
    """
    if store is None:
        return None
    winner = store.get_winner(TuningKey.for_problem(device, problem, shape.rows))
    if winner is None:
        return None
    try:
        status, _ = lookup.verdict(winner, problem, limits)
    except (TypeError, ValueError):  # a configuration this family cannot read
        return None
    return winner if status == lookup.USABLE else None
