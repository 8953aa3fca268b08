"""Shapes and records: the problems a run measures and the record each measurement fills."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from .constants import (
    COPY_ROUND,
    DEFAULT_OP,
    ITEMSIZE,
    LLM_HIDDEN,
    LLM_TOKENS,
    RUN_ORDER,
    SWEEP_ELEMENTS,
    TOL,
)
from .ops import OPS


@dataclass(frozen=True)
class Shape:
    """One problem: a suite name, a dtype and a (rows, hidden) input."""

    suite: str
    dtype: str
    hidden: int
    rows: int
    op: str = DEFAULT_OP

    @property
    def bytes(self) -> int:
        """Fewest bytes a forward must move: x read, y written, weight (and bias) read; with a
        residual, it read and h written too."""
        item, op = ITEMSIZE[self.dtype], OPS[self.op]
        return self.rows * self.hidden * item * op.row_streams + op.vectors * self.hidden * item

    @property
    def copy_bytes(self) -> int | None:
        """Buffer bytes of the copy this shape's share is taken of, or None.

        x's bytes (x's and the residual's where there is one: a copy moving the same bytes),
        to a MiB. None for the latency suite, whose share stays over the fixed-size copy.
        """
        if self.suite == "latency":
            return None
        read_bytes = self.rows * self.hidden * ITEMSIZE[self.dtype] * OPS[self.op].row_streams // 2
        return max(COPY_ROUND, (read_bytes + COPY_ROUND // 2) // COPY_ROUND * COPY_ROUND)

    def label(self) -> str:
        op = "" if self.op == DEFAULT_OP else f"{self.op} "
        return f"{op}{self.suite} {self.dtype} h={self.hidden} rows={self.rows}"


def build_shapes(args: argparse.Namespace) -> list[Shape]:
    shapes: list[Shape] = []
    # The small suites run first, so a run cut short by --budget-s loses sweep shapes only.
    for suite in [s for s in RUN_ORDER if s in args.suites]:
        if suite == "sweep":
            for dt in args.dtypes:
                for h in args.hidden:
                    shapes.append(Shape("sweep", dt, h, max(1, SWEEP_ELEMENTS // h), args.op))
        elif suite == "latency":
            for dt in args.latency_dtypes:
                for h in args.latency_hidden:
                    for r in args.latency_rows:
                        shapes.append(Shape("latency", dt, h, r, args.op))
        elif suite == "llm":
            for dt in args.latency_dtypes:
                for h in LLM_HIDDEN:
                    shapes.append(Shape("llm", dt, h, LLM_TOKENS, args.op))
    return shapes


def new_record(shape: Shape, impl: str) -> dict:
    record = {
        "suite": shape.suite,
        "dtype": shape.dtype,
        "hidden": shape.hidden,
        "rows": shape.rows,
        "bytes": shape.bytes,
        "impl": impl,
        "status": "error",  # ok | WRONG | error | unavailable | skipped
        "rel_err": None,
        "tol": TOL[shape.dtype],
        "ms": None,
        "ms_p20": None,
        "ms_p80": None,
        "gbps": None,
        "share": None,
        # Which flush ``ms`` was timed after: "read" (bandwidth suites), "zero" (latency, do_bench).
        "flush": "zero" if shape.suite == "latency" else "read",
        "copy_bytes": shape.copy_bytes,
        # Bandwidth suites only: the same launches after do_bench's zeroing flush.
        "ms_zero": None,
        "ms_zero_p20": None,
        "ms_zero_p80": None,
        "gbps_zero": None,
        "share_zero": None,
        "share_fixed_copy": None,
        "graph_us": None,
        "host_us": None,
        "first_call_s": None,
        "path": None,
        "out_dtype": None,
        "error": None,
    }
    if OPS[shape.op].has_residual:
        # h = x + residual, the second output: checked as y is, and its largest difference from
        # the rounded float64 sum (0 where the sum is rounded once, as it should be).
        record |= {"h_rel_err": None, "h_max_abs_err": None}
    return record | op_fields(shape.op)


def op_fields(op: str) -> dict:
    """``{"op": op}`` for a record or the meta; nothing for LayerNorm, the op a run without one
    is (readers of LayerNorm results see one format)."""
    return {} if op == DEFAULT_OP else {"op": op}


def gbps_of(nbytes: int, ms: float | None) -> float | None:
    if ms is None or not ms > 0:
        return None
    return nbytes / (ms * 1e-3) / 1e9
