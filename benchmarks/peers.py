#!/usr/bin/env python3
"""Compare autonorm's LayerNorm, RMSNorm or fused add + RMSNorm forward with its peers on a GPU.

LayerNorm peers (the default, ``--op layer_norm``): PyTorch eager (``F.layer_norm``),
``torch.compile`` of it (``dynamic=False``), a Triton-tutorial-style kernel
(``benchmarks/triton_tutorial_ln.py``) and Liger-Kernel's LayerNorm. RMSNorm peers
(``--op rms_norm``): eager ``F.rms_norm``, ``torch.compile`` of it and Liger-Kernel's RMSNorm
(its default "llama" casting). Fused residual add + RMSNorm (``--op add_rms_norm``: ``h = x +
residual``, ``y = rms_norm(h) * w``, both returned): eager ``h = x + r`` then ``F.rms_norm(h)``,
``torch.compile`` of the two together and Liger-Kernel's fused add RMSNorm; autonorm runs
functional and, as ``autonorm-inplace``, in place (vLLM's form: ``residual`` becomes h, ``x``
becomes y). What differs between the ops is the table ``OPS``.

Run on the GPU machine, from the repository root::

    python3 benchmarks/peers.py --out results/     # everything (about 5 minutes on an H200)
    python3 benchmarks/peers.py --quick --out $OUT # fewer sweep shapes
    python3 benchmarks/peers.py --op rms_norm --quick --out $OUT  # RMSNorm
    python3 benchmarks/peers.py --op add_rms_norm --quick --out $OUT  # fused add + RMSNorm
    python3 benchmarks/peers.py --selftest         # no GPU: tables, JSON, plot on fake numbers

Method (docs/timing.md; the H200 figures are in docs/results.md): every implementation is
first checked against a float64 reference on the same input (relative L2 error; above 1e-2 for
bf16/fp16 or 1e-4 for fp32 it is flagged WRONG), then timed. The fused add returns two outputs:
both are checked, h against the float64 sum rounded once to the dtype (its largest absolute
difference is reported too: a correctly rounded sum has none).

Bandwidth suites (sweep, llm) time single launches between CUDA events, each after a flush of
the L2, median of the repeats, under two flushes back to back:

- ``read`` (primary): sum a 256 MB buffer. The inputs are evicted and the L2 holds only clean
  lines, so the launch pays for its own traffic and nothing else.
- ``zero`` (secondary, what ``triton.testing.do_bench`` does): zero the same buffer. The L2 is
  left full of dirty lines whose write-back lands inside the timed launch, a fixed 4-6 us per
  launch on an H200; kept for comparison with figures timed by ``do_bench``.

The share is GB/s over a device-to-device copy of the same bytes as x (2 x that moved), timed
under the same flush in the same run: a fixed cost weighs more on a short launch, so a copy of
another size would be a biased yardstick. A fixed 2^28-byte copy is timed too, for reference.
Latency shapes are timed with ``do_bench`` (its zeroing flush), by CUDA-graph replay
(``do_bench_cudagraph``, L2 not flushed) and host-inclusive (wall time of back-to-back calls).
Bandwidth counts x read once, y written once, weight and bias (RMSNorm: the weight) read once;
the fused add also reads the residual once and writes h once, and its share is over a copy of
x's and the residual's bytes (the same bytes moved). The in-place form runs on copies of x and
the residual of its own, which each launch overwrites (adding the last y to the last h, values
grow, and overflow in fp16 after some thousands of launches): its correctness is checked on the
first launch, on fresh copies; they are put back before each timed launch of the bandwidth
suites (before its flush, outside the timed window) and before each latency measurement, which
launches back to back (the largest value after it is reported). A failure of one
implementation at one shape becomes an error row; the run carries on. Results are written to
``--out`` after every shape, so a run cut short still leaves ``peers.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import faulthandler
import functools
import glob
import inspect
import io
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

ALL_IMPLS = ("autonorm", "autonorm-inplace", "eager", "compile", "triton", "liger")
IN_PLACE_IMPLS = ("autonorm-inplace",)
# Fixed per implementation, so a name keeps its colour in every op's plot.
COLORS = {"autonorm": "C0", "eager": "C1", "compile": "C2", "triton": "C3", "liger": "C4",
          "autonorm-inplace": "C5"}
DEFAULT_OP = "layer_norm"
PEERS = ("eager", "compile", "triton", "liger")
ALL_SUITES = ("sweep", "latency", "llm")
RUN_ORDER = ("latency", "llm", "sweep")
DTYPES = ("bf16", "fp16", "fp32")
ITEMSIZE = {"bf16": 2, "fp16": 2, "fp32": 4}
TOL = {"bf16": 1e-2, "fp16": 1e-2, "fp32": 1e-4}

SWEEP_HIDDEN = (768, 1024, 2048, 4096, 8192, 12288, 16384, 32768, 65536)
QUICK_HIDDEN = (1024, 4096, 16384, 65536)
QUICK_DTYPES = ("bf16", "fp32")
SWEEP_ELEMENTS = 2**26
LATENCY_HIDDEN = 16384
LATENCY_ROWS = (1, 8, 64, 512)
LLM_TOKENS = 4096
LLM_HIDDEN = (4096, 8192)

EPS = 1e-5
DEVICE = "cuda"  # a module constant so a CPU dry run can patch it
COPY_BYTES = 2**28  # the fixed reference copy's buffer (2^29 bytes moved)
# Copies are timed at x's size rounded to a MiB: sizes a few KiB apart (hidden 768 and 12288
# do not divide 2^26) would each get a copy of their own, with its own noise, and cudaMemcpy's
# rate depends on a size's last few KiB (docs/timing.md). The tuner's finals round the same
# way (autonorm.runtime.timing.copy_buffer_bytes; not imported here: --selftest runs without
# autonorm).
COPY_ROUND = 2**20
FLUSH_BYTES = 256 * 2**20  # over 4x the H200's 60 MB L2, as do_bench's flush buffer
FLUSHES = ("read", "zero")  # primary first
FLUSH_MIN_REPS = 25
FLUSH_MAX_REPS = 1000
HOST_CALLS = 200
HOST_REPEATS = 5
BENCH_WARMUP_MS = 25
BENCH_REP_MS = 100
GRAPH_REP_MS = 20
QUANTILES = [0.5, 0.2, 0.8]
TARGET_SHARE = 0.95
MAX_PROBLEM_LINES = 25


# --------------------------------------------------------------------------------------------
# Ops: what differs between the norms compared (everything else is shared)
# --------------------------------------------------------------------------------------------


def _repo_on_path() -> None:
    """Import autonorm from this checkout when it is one (before an installed copy)."""
    if (REPO / "autonorm" / "__init__.py").is_file() and str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))


def _layer_norm_eager(F, shape, x, w, b, eps: float, r=None):  # noqa: N803, ARG001
    hid = (shape.hidden,)
    return lambda: F.layer_norm(x, hid, w, b, eps)


def _rms_norm_eager(F, shape, x, w, b, eps: float, r=None):  # noqa: N803, ARG001
    hid = (shape.hidden,)
    return lambda: F.rms_norm(x, hid, w, eps)


def _add_rms_norm_eager(F, shape, x, w, b, eps: float, r=None):  # noqa: N803, ARG001
    hid = (shape.hidden,)

    def add_then_norm():
        h = x + r
        return F.rms_norm(h, hid, w, eps), h

    return add_then_norm


def _layer_norm_compiled(F):  # noqa: N803
    def ln(x, w, b, eps: float, r=None):  # noqa: ARG001 - one signature for every op
        return F.layer_norm(x, (x.shape[-1],), w, b, eps)

    return ln


def _rms_norm_compiled(F):  # noqa: N803
    def rms(x, w, b, eps: float, r=None):  # noqa: ARG001 - one signature for every op
        return F.rms_norm(x, (x.shape[-1],), w, eps)

    return rms


def _add_rms_norm_compiled(F):  # noqa: N803
    def add_rms(x, w, b, eps: float, r=None):  # noqa: ARG001 - one signature for every op
        # The add and the norm in one compiled function, so Inductor can fuse them.
        h = x + r
        return F.rms_norm(h, (x.shape[-1],), w, eps), h

    return add_rms


def _layer_norm_reference(F, shape, x, w, b, eps: float, r=None):  # noqa: N803, ARG001
    import torch

    f64 = torch.float64
    return F.layer_norm(x.to(f64), (shape.hidden,), w.to(f64), b.to(f64), eps)


def _rms_norm_reference(F, shape, x, w, b, eps: float, r=None):  # noqa: N803, ARG001
    """autonorm's float64 RMSNorm reference on CuPy views; the same formula in torch without
    CuPy (a machine where autonorm cannot run still checks its peers)."""
    import torch

    x64, w64 = x.to(torch.float64), w.to(torch.float64)
    _repo_on_path()
    try:
        import cupy

        from autonorm.ops.rms_norm.reference import rms_norm_reference
    except ImportError:
        return x64 * torch.rsqrt((x64 * x64).mean(-1, keepdim=True) + eps) * w64
    y = rms_norm_reference(cupy.from_dlpack(x64), cupy.from_dlpack(w64), eps)
    return torch.from_dlpack(y)


def rounded_sum(x, r):
    """``x + r`` summed in float64 and rounded to x's dtype: the correctly rounded sum.

    Rounding the sum to float64 first, or to float32 on the way to bf16 or fp16, rounds once in
    effect: each intermediate format has at least 2p + 2 bits for a sum of two p-bit numbers,
    and there rounding twice equals rounding once (the same bits as
    ``autonorm.numerics.from_float64``; tests/test_peers_add_rms.py compares them).
    """
    import torch

    return (x.to(torch.float64) + r.to(torch.float64)).to(x.dtype)


def _add_rms_norm_reference(F, shape, x, w, b, eps: float, r=None):  # noqa: N803
    """(y, h) in float64: h the sum rounded to the dtype, y the RMSNorm reference of that h."""
    import torch

    h = rounded_sum(x, r)
    return _rms_norm_reference(F, shape, h, w, b, eps), h.to(torch.float64)


@dataclass(frozen=True)
class Op:
    """One norm the benchmark compares: its peers, its bytes, its reference and its calls.

    The builders take the bound inputs (``r``: the residual, None for a norm without one) and
    return the zero-argument callable that is timed, so each op calls its functions directly
    (no adapter inside the timed call). That callable returns y, or ``(y, h)`` for the fused
    add; the reference returns the same in float64.
    """

    title: str  # in the tables and the plot, e.g. "LayerNorm forward"
    impls: tuple[str, ...]  # the implementations that exist for it, in ALL_IMPLS' order
    has_bias: bool  # a bias is made, passed and counted
    entry: str  # autonorm's function, in autonorm and autonorm.torch
    liger: tuple[str, str]  # Liger-Kernel's module and autograd Function
    eager: Callable  # (F, shape, x, w, b, eps, r) -> callable
    compiled: Callable  # (F) -> fn(x, w, b, eps, r), compiled once per dtype
    liger_call: Callable  # (Function, x, w, b, eps, r) -> callable
    autonorm_call: Callable  # (autonorm's function, x, w, b, eps, r) -> callable
    reference: Callable  # (F, shape, x, w, b, eps, r) -> float64 torch tensor (or y, h)
    has_residual: bool = False  # a residual is made, added, passed and counted; h returned
    # (autonorm's function, x, w, b, eps, r) -> callable writing y into x and h into r
    in_place_call: Callable | None = None

    @property
    def vectors(self) -> int:
        """Hidden-sized vectors read once besides x: the weight, and the bias where one is."""
        return 1 + int(self.has_bias)

    @property
    def row_streams(self) -> int:
        """x-sized tensors moved once: x read and y written, and the residual read and h
        written where there is one."""
        return 2 + 2 * int(self.has_residual)


OPS: dict[str, Op] = {
    "layer_norm": Op(
        title="LayerNorm forward", impls=("autonorm", "eager", "compile", "triton", "liger"),
        has_bias=True, entry="layer_norm",
        liger=("liger_kernel.ops.layer_norm", "LigerLayerNormFunction"),
        eager=_layer_norm_eager, compiled=_layer_norm_compiled,
        liger_call=lambda fn, x, w, b, eps, r=None: lambda: fn.apply(x, w, b, eps),
        autonorm_call=lambda fn, x, w, b, eps, r=None: lambda: fn(x, w, b, eps),
        reference=_layer_norm_reference,
    ),
    "rms_norm": Op(
        title="RMSNorm forward", impls=("autonorm", "eager", "compile", "liger"), has_bias=False,
        entry="rms_norm", liger=("liger_kernel.ops.rms_norm", "LigerRMSNormFunction"),
        eager=_rms_norm_eager, compiled=_rms_norm_compiled,
        # Liger's defaults: no offset, "llama" casting (fp32 statistics, as autonorm's).
        liger_call=lambda fn, x, w, b, eps, r=None: lambda: fn.apply(x, w, eps),
        autonorm_call=lambda fn, x, w, b, eps, r=None: lambda: fn(x, w, eps=eps),
        reference=_rms_norm_reference,
    ),
    "add_rms_norm": Op(
        title="Fused add + RMSNorm forward",
        impls=("autonorm", "autonorm-inplace", "eager", "compile", "liger"), has_bias=False,
        entry="add_rms_norm",
        liger=("liger_kernel.ops.fused_add_rms_norm", "LigerFusedAddRMSNormFunction"),
        eager=_add_rms_norm_eager, compiled=_add_rms_norm_compiled,
        # Liger's defaults: no offset, "llama" casting; it returns (y, h) as autonorm does.
        liger_call=lambda fn, x, w, b, eps, r=None: lambda: fn.apply(x, r, w, eps),
        autonorm_call=lambda fn, x, w, b, eps, r=None: lambda: fn(x, r, w, eps=eps),
        reference=_add_rms_norm_reference,
        has_residual=True,
        in_place_call=lambda fn, x, w, b, eps, r=None: lambda: fn(x, r, w, eps=eps,
                                                                   in_place=True),
    ),
}


# --------------------------------------------------------------------------------------------
# Shapes and records
# --------------------------------------------------------------------------------------------


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


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _choices(text: str, allowed: tuple[str, ...], what: str) -> list[str]:
    items = _csv(text)
    bad = [t for t in items if t not in allowed]
    if bad or not items:
        raise argparse.ArgumentTypeError(
            f"{what}: {', '.join(bad) or '(empty)'} not in {', '.join(allowed)}"
        )
    return items


def _positive_list(text: str, flag: str = "--hidden", example: str = "1024,4096") -> list[int]:
    try:
        vals = [int(t) for t in _csv(text)]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{flag}: {exc}") from exc
    if not vals or any(v <= 0 for v in vals):
        raise argparse.ArgumentTypeError(f"{flag}: give positive integers, e.g. {example}")
    return vals


def _hidden_list(text: str) -> list[int]:
    return _positive_list(text)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=(
            "Compare autonorm's LayerNorm forward with PyTorch eager, torch.compile, a\n"
            "Triton-tutorial kernel and Liger-Kernel on one CUDA GPU (--op rms_norm: RMSNorm\n"
            "forward, against eager, torch.compile and Liger; --op add_rms_norm: residual add\n"
            "+ RMSNorm, against eager add + rms_norm, torch.compile of both and Liger's fused\n"
            "add RMSNorm, autonorm functional and in place). Every implementation is\n"
            "checked against float64, then timed:\n"
            "  sweep    2^26 elements at each hidden size, single launches after an L2 flush,\n"
            "           as a share of a device-to-device copy of the same bytes;\n"
            "  llm      bf16, 4,096 tokens at hidden 4096 and 8192, timed as the sweep;\n"
            "  latency  hidden 16384, rows 1-512 (--latency-hidden, --latency-rows): do_bench,\n"
            "           CUDA-graph replay, host time.\n"
            "Prints the tables and writes peers.json and peers.png to --out.\n"
            "Method: docs/timing.md. H200 figures: docs/results.md."
        ),
        epilog=(
            "examples:\n"
            "  python benchmarks/peers.py --out results/          all suites (~5 min, H200)\n"
            "  python benchmarks/peers.py --quick --out results/  4 hidden sizes, bf16, fp32\n"
            "  python benchmarks/peers.py --suites latency        the latency suite alone\n"
            "  python benchmarks/peers.py --op rms_norm --quick   RMSNorm, 4 hidden sizes\n"
            "  python benchmarks/peers.py --op add_rms_norm --quick  fused add + RMSNorm\n"
            "  python benchmarks/peers.py --op rms_norm --suites latency --latency-hidden\n"
            "      2048,4096,8192 --latency-rows 1,8,64 --latency-dtypes bf16,fp32   decode"
            "  python benchmarks/peers.py --selftest              no GPU: synthetic numbers"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--dtypes", type=lambda s: _choices(s, DTYPES, "--dtypes"), default=None,
                   help="sweep dtypes, e.g. bf16,fp16,fp32 (default all; --quick: bf16,fp32)")
    p.add_argument("--hidden", type=_hidden_list, default=None,
                   help="sweep hidden sizes, comma-separated (default "
                        + ",".join(map(str, SWEEP_HIDDEN)) + ")")
    p.add_argument("--suites", type=lambda s: _choices(s, ALL_SUITES, "--suites"),
                   default=list(ALL_SUITES),
                   help="sweep,latency,llm (default all; run as latency, llm, sweep)")
    p.add_argument("--op", choices=tuple(OPS), default=DEFAULT_OP,
                   help="the norm compared (default layer_norm)")
    p.add_argument("--impls", type=lambda s: _choices(s, ALL_IMPLS, "--impls"),
                   default=None, help="autonorm,eager,compile,triton,liger (default: every one "
                                      "the op has; rms_norm has no triton); add_rms_norm: "
                                      "autonorm,autonorm-inplace,eager,compile,liger")
    p.add_argument("--latency-dtypes", type=lambda s: _choices(s, DTYPES, "--latency-dtypes"),
                   default=["bf16"], help="dtypes of the latency and llm suites (default bf16)")
    p.add_argument("--latency-hidden", default=[LATENCY_HIDDEN],
                   type=lambda s: _positive_list(s, "--latency-hidden", "2048,4096"),
                   help=f"hidden sizes of the latency suite (default {LATENCY_HIDDEN}), e.g. "
                        "a model's decode shapes")
    p.add_argument("--latency-rows", default=list(LATENCY_ROWS),
                   type=lambda s: _positive_list(s, "--latency-rows", "1,8,64"),
                   help="row counts of the latency suite (default "
                        + ",".join(map(str, LATENCY_ROWS)) + ")")
    p.add_argument("--quick", action="store_true",
                   help="sweep only hidden " + ",".join(map(str, QUICK_HIDDEN)) + " in bf16,fp32")
    p.add_argument("--out", default=None,
                   help="output folder (default benchmarks/results; --selftest: a temp folder)")
    p.add_argument("--budget-s", type=float, default=520.0,
                   help="after this many seconds, remaining shapes are skipped (error rows)")
    p.add_argument("--liger-wheel", default="auto",
                   help="if liger_kernel does not import: 'auto' installs a liger_kernel-*.whl "
                        "found in .whl/ or shared/device/wheels (--no-deps, offline), a path "
                        "installs that wheel, 'none' installs nothing")
    p.add_argument("--plain", action="store_true", help="plain-text tables even if rich is there")
    p.add_argument("--selftest", action="store_true",
                   help="no GPU: exercise parsing, tables, JSON and plot on synthetic numbers")
    args = p.parse_args(argv)
    op = OPS[args.op]
    if args.impls is None:
        args.impls = list(op.impls)
    missing = [name for name in args.impls if name not in op.impls]
    if missing:
        p.error(f"--impls: {', '.join(missing)} has no {args.op} implementation here "
                f"({', '.join(op.impls)})")
    if args.dtypes is None:
        args.dtypes = list(QUICK_DTYPES) if args.quick else list(DTYPES)
    if args.hidden is None:
        args.hidden = list(QUICK_HIDDEN) if args.quick else list(SWEEP_HIDDEN)
    if args.out is None:
        args.out = tempfile.mkdtemp(prefix="peers-selftest-") if args.selftest else str(
            HERE / "results"
        )
    return args


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


def _short(exc: BaseException, limit: int = 300) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().replace("\n", " | ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------------------------------
# Implementations (everything below imports torch lazily: --selftest needs none of it)
# --------------------------------------------------------------------------------------------


class Unavailable(Exception):
    """An implementation cannot run at all in this environment."""


def _torch_dtype(name: str):
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def _as_torch(y):
    """A torch tensor of an output (CuPy through DLPack); a tuple of them for ``(y, h)``."""
    import torch

    if isinstance(y, torch.Tensor):
        return y
    if isinstance(y, tuple):
        return tuple(_as_torch(t) for t in y)
    return torch.from_dlpack(y)


def _install_liger(spec: str) -> str:
    """Try to install a Liger wheel without network; return what was done."""
    if spec == "none":
        return "not installed (--liger-wheel none)"
    if spec == "auto":
        patterns = [
            REPO / ".whl" / "liger_kernel-*.whl",
            REPO / "shared" / "device" / "wheels" / "liger_kernel-*.whl",
            REPO.parent / "shared" / "device" / "wheels" / "liger_kernel-*.whl",
        ]
        found = [f for pat in patterns for f in sorted(glob.glob(str(pat)))]
        if not found:
            return "no liger_kernel wheel found in .whl/ or shared/device/wheels/"
        wheel = found[-1]
    else:
        wheel = spec
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", wheel]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    except Exception as exc:  # noqa: BLE001 - report and carry on
        return f"pip install {wheel} failed: {_short(exc)}"
    if proc.returncode != 0:
        return f"pip install {wheel} failed: {(proc.stderr or proc.stdout)[-300:]}"
    return f"installed {wheel}"


class Impls:
    """Holds each implementation's callable factory, or the reason it is unavailable."""

    def __init__(self, names: list[str], liger_wheel: str, op: str = DEFAULT_OP) -> None:
        import torch
        import torch.nn.functional as F  # noqa: N812

        self.torch = torch
        self.F = F
        self.names = names
        self.op = OPS[op]
        self.unavailable: dict[str, str] = {
            name: f"no {op} implementation" for name in names if name not in self.op.impls}
        self.versions: dict[str, str | None] = {}
        self.notes: dict[str, str] = {}
        self._compiled: dict[str, object] = {}
        self._autonorm = None
        self._autonorm_torch = None
        self._liger = None
        self._triton_ln = None

        if any(name in ("autonorm", *IN_PLACE_IMPLS) for name in names):
            self._load_autonorm()
        if "compile" in names:
            self._setup_compile()
        if "triton" in names and "triton" not in self.unavailable:
            try:
                sys.path.insert(0, str(HERE))
                import triton_tutorial_ln

                self._triton_ln = triton_tutorial_ln.layer_norm
            except Exception as exc:  # noqa: BLE001
                self.unavailable["triton"] = _short(exc)
        if "liger" in names:
            self._load_liger(liger_wheel)

    # -- loading ---------------------------------------------------------------------------

    def _load_autonorm(self) -> None:
        _repo_on_path()
        entry = self.op.entry
        errors = []
        try:
            import autonorm

            self.versions["autonorm"] = getattr(autonorm, "__version__", None)
            self.notes["autonorm_file"] = getattr(autonorm, "__file__", None) or "?"
        except Exception as exc:  # noqa: BLE001
            self._autonorm_unavailable(_short(exc))
            return
        try:
            self._autonorm = getattr(autonorm, entry)  # lazy attribute: imports autonorm.dispatch
        except Exception as exc:  # noqa: BLE001
            errors.append(f"autonorm.{entry}: {_short(exc)}")
        try:
            import autonorm.torch as an_torch

            if not hasattr(an_torch, entry):
                raise AttributeError(f"autonorm.torch has no {entry}")
            self._autonorm_torch = getattr(an_torch, entry)
        except Exception as exc:  # noqa: BLE001
            errors.append(f"autonorm.torch.{entry}: {_short(exc)}")
        if errors:
            self.notes["autonorm_import"] = "; ".join(errors)
        if self._autonorm is None and self._autonorm_torch is None:
            self._autonorm_unavailable("; ".join(errors))

    def _autonorm_unavailable(self, why: str) -> None:
        """Mark autonorm's forms that were asked for (functional, in place) unavailable."""
        for name in ("autonorm", *IN_PLACE_IMPLS):
            if name in self.names:
                self.unavailable.setdefault(name, why)

    def _setup_compile(self) -> None:
        torch = self.torch
        try:
            import torch._dynamo as dynamo

            cfg = dynamo.config
            # One compiled function, recompiled per shape and dtype (dynamic=False): allow
            # enough cache entries, and fail loudly instead of silently running eager.
            settings = (
                (("recompile_limit", "cache_size_limit"), 512),
                (("accumulated_recompile_limit", "accumulated_cache_size_limit"), 4096),
                (("fail_on_recompile_limit_hit",), True),
                (("suppress_errors",), False),
            )
            for aliases, val in settings:
                for name in aliases:
                    if hasattr(cfg, name):
                        setattr(cfg, name, val)
                        break
        except Exception as exc:  # noqa: BLE001
            self.notes["compile_config"] = _short(exc)
        norm = self.op.compiled(self.F)
        try:
            for dt in DTYPES:
                self._compiled[dt] = torch.compile(norm, dynamic=False)
        except Exception as exc:  # noqa: BLE001
            self.unavailable["compile"] = _short(exc)

    def _load_liger(self, wheel_spec: str) -> None:
        module, function = self.op.liger

        def attempt():
            import importlib

            return getattr(importlib.import_module(module), function)

        try:
            fn = attempt()
        except Exception as exc:  # noqa: BLE001
            first = _short(exc)
            self.notes["liger_install"] = _install_liger(wheel_spec)
            if not self.notes["liger_install"].startswith("installed"):
                self.unavailable["liger"] = f"{first}; {self.notes['liger_install']}"
                return
            import importlib

            importlib.invalidate_caches()
            try:
                fn = attempt()
            except Exception as exc2:  # noqa: BLE001
                self.unavailable["liger"] = _short(exc2)
                return
        self._liger = fn
        try:
            from importlib.metadata import version

            self.versions["liger"] = version("liger-kernel")
        except Exception:  # noqa: BLE001
            self.versions["liger"] = "?"

    # -- factories: return (fn, info); fn() computes y from the bound inputs -----------------

    def make(self, impl: str, shape: Shape, x, w, b, eps: float, r=None):
        """Return (fn, info): fn() computes the op's outputs from the bound inputs.

        ``r`` is the residual of an op with one (None otherwise).
        """
        if impl in self.unavailable:
            raise Unavailable(self.unavailable[impl])
        if impl == "eager":
            return self.op.eager(self.F, shape, x, w, b, eps, r), {}
        if impl == "compile":
            cfn = self._compiled[shape.dtype]
            return (lambda: cfn(x, w, b, eps, r)), {}
        if impl == "triton":
            tfn = self._triton_ln
            return (lambda: tfn(x, w, b, eps)), {}
        if impl == "liger":
            return self.op.liger_call(self._liger, x, w, b, eps, r), {}
        if impl == "autonorm":
            return self._make_autonorm(x, w, b, eps, r)
        if impl in IN_PLACE_IMPLS:
            return self._make_autonorm(x, w, b, eps, r, in_place=True)
        raise ValueError(impl)

    def _make_autonorm(self, x, w, b, eps: float, r=None, in_place: bool = False):
        """Find a way in that works, in this order, and say which one ran (``path``).

        ``torch``: ``autonorm.layer_norm`` (``rms_norm``: the op's function) on the torch
        tensors; ``autonorm.torch``: ``autonorm.torch.layer_norm`` on them; ``dlpack``:
        ``autonorm.layer_norm`` on CuPy views (``cupy.from_dlpack``) run on torch's current
        stream, result back through DLPack.

        ``in_place`` (the op's ``in_place_call``) runs on copies of x and the residual, which
        every launch overwrites: the other implementations keep reading the originals. The
        copies are restored after the probe, so the first call after this (the check) sees
        the inputs every other implementation saw.
        """
        torch = self.torch
        an, an_torch = self._autonorm, self._autonorm_torch
        bind = self.op.in_place_call if in_place else self.op.autonorm_call

        def restore() -> None:
            pass

        if in_place:
            x_in, r_in = x, r
            x, r = x_in.clone(), r_in.clone()

            def restore() -> None:
                x.copy_(x_in)
                r.copy_(r_in)

        def on_torch(fn):
            call = bind(fn, x, w, b, eps, r)
            return lambda: _as_torch(call())

        # (path, builder); a builder returns the callable to time.
        candidates = []
        if an is not None:
            candidates.append(("torch", lambda: on_torch(an)))
        if an_torch is not None:
            candidates.append(("autonorm.torch", lambda: on_torch(an_torch)))
        if an is not None:
            candidates.append(("dlpack", lambda: self._dlpack_fn(bind, an, x, w, b, eps, r)))
        info: dict = {}
        failures = []
        for path, build in candidates:
            t0 = time.perf_counter()
            try:
                fn = build()
                fn()
                torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001
                failures.append(f"{path} path: {_short(exc, 200)}")
                _sync_quietly()
                continue
            restore()  # a failed path's partial writes are undone here too
            info["path"] = path
            if in_place:
                info["restore"] = restore  # run_shape takes it out: not a record field
            info["probe_s"] = time.perf_counter() - t0
            if failures:
                info["failed_paths"] = "; ".join(failures)
            return fn, info
        raise RuntimeError("; ".join(failures) or "no autonorm entry point")

    def _dlpack_fn(self, bind, an, x, w, b, eps: float, r=None):
        """Return a callable running ``an`` (bound by ``bind``) on CuPy views of the tensors."""
        torch = self.torch
        import cupy

        from autonorm.runtime.driver import wrap_stream

        def view(t):
            return None if t is None else cupy.from_dlpack(t)

        call = bind(an, view(x), view(w), view(b), eps, view(r))

        def dlpack_path():
            # Run on torch's current stream so do_bench events and graph capture see the work.
            stream = wrap_stream(torch.cuda.current_stream().cuda_stream)
            with stream:
                y = call()
            return _as_torch(y)

        return dlpack_path


# --------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------


def _call_bench(bench_fn, fn, **kw) -> tuple[float, float | None, float | None]:
    """Median (and 20th/80th percentiles where the API gives them) in ms."""
    params = inspect.signature(bench_fn).parameters
    if "quantiles" in params:
        r = bench_fn(fn, quantiles=QUANTILES, **kw)
        if isinstance(r, (list, tuple)):
            return float(r[0]), float(r[1]), float(r[2])
        return float(r), None, None
    if "return_mode" in params:
        return float(bench_fn(fn, return_mode="median", **kw)), None, None
    r = bench_fn(fn, **kw)
    return (float(r[0]), None, None) if isinstance(r, (list, tuple)) else (float(r), None, None)


def bench_ms(fn):
    from triton.testing import do_bench

    return _call_bench(do_bench, fn, warmup=BENCH_WARMUP_MS, rep=BENCH_REP_MS)


def graph_ms(fn, rep_ms: int = GRAPH_REP_MS):
    """CUDA-graph replay time of ``fn`` (``do_bench_cudagraph``, L2 not flushed), in ms."""
    import torch
    from triton.testing import do_bench_cudagraph

    torch.cuda.synchronize()
    return _call_bench(do_bench_cudagraph, fn, rep=rep_ms)


def host_us(fn) -> float:
    """Host-inclusive latency: wall time of back-to-back calls over their number."""
    import torch

    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(HOST_REPEATS):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(HOST_CALLS):
            fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) / HOST_CALLS)
    return statistics.median(samples) * 1e6


@functools.cache
def _flush_buffer():
    """The flush buffer, allocated once: a fresh 256 MB allocation per measurement would cost
    time and could fail late in a run when memory is fragmented."""
    import torch

    return torch.zeros(FLUSH_BYTES // 4, dtype=torch.int32, device=DEVICE)


def flush_launch(kind: str):
    """Return the callable run before each timed launch: ``read`` or ``zero`` (see FLUSHES)."""
    buf = _flush_buffer()
    if kind == "read":
        # Evicts the inputs and leaves only clean lines: nothing to write back in the launch.
        return lambda: buf.sum()
    if kind == "zero":
        # do_bench's flush: the L2 is left full of dirty lines, written back during the launch.
        return buf.zero_
    raise ValueError(f"unknown flush {kind!r}")


def rep_count(est_ms: float, budget_ms: float) -> int:
    """Repeats covering about ``budget_ms`` of kernel time, within the min and max reps."""
    if not est_ms > 0:
        return FLUSH_MAX_REPS
    return min(FLUSH_MAX_REPS, max(FLUSH_MIN_REPS, math.ceil(budget_ms / est_ms)))


def summarize_ms(times: list[float]) -> tuple[float, float, float]:
    """Median, 20th and 80th percentiles (linear interpolation, as torch.quantile)."""
    s = sorted(times)
    if not s:
        raise ValueError("no samples")

    def q(p: float) -> float:
        pos = p * (len(s) - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (pos - lo)

    return q(0.5), q(0.2), q(0.8)


def flushed_ms(fn, flush: str, restore=None) -> tuple[float, float, float]:
    """Time single launches of ``fn``, each after a flush of the L2; (median, p20, p80) in ms.

    Args:
        fn: the launch to time (already called once, so compiled and loaded).
        flush: ``"read"`` or ``"zero"``, see ``flush_launch``.
        restore: called before each timed launch's flush, or None: puts back the inputs an
            in-place form overwrote, so every timed launch runs on the inputs that were checked
            (the flush then evicts what it wrote, before the start event).

    Returns:
        Median, 20th and 80th percentile of the per-launch event times, in ms.
    """
    import torch

    pre = flush_launch(flush)

    def events(n: int) -> list:
        return [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                for _ in range(n)]

    def timed(pairs: list) -> None:
        for a, b in pairs:
            if restore is not None:
                restore()
            pre()
            a.record()
            fn()
            b.record()

    fn()
    torch.cuda.synchronize()
    est = events(5)
    timed(est)
    torch.cuda.synchronize()
    est_ms = statistics.median(a.elapsed_time(b) for a, b in est)
    # Warm-up without a sync after it: the GPU is still busy with it while the host queues the
    # timed launches, so no launch waits on the host between its start event and the kernel.
    for _ in range(min(FLUSH_MAX_REPS, max(3, math.ceil(BENCH_WARMUP_MS / max(est_ms, 1e-3))))):
        fn()
    pairs = events(rep_count(est_ms, BENCH_REP_MS))
    timed(pairs)
    torch.cuda.synchronize()
    return summarize_ms([a.elapsed_time(b) for a, b in pairs])


def copy_sizes(shapes: list[Shape]) -> list[int]:
    """Copy buffer sizes to time: each bandwidth shape's ``copy_bytes`` and the fixed one."""
    return sorted({s.copy_bytes for s in shapes if s.copy_bytes is not None} | {COPY_BYTES})


def measure_copies(sizes: list[int]) -> list[dict]:
    """Time a device-to-device copy of each buffer size under each flush (adjacent in time)."""
    import torch

    out: list[dict] = []
    for nbytes in sizes:
        entries = {f: {"bytes_buffer": nbytes, "bytes_moved": 2 * nbytes, "flush": f,
                       "gbps": None} for f in FLUSHES}
        try:
            src = torch.randn(nbytes // 2, device=DEVICE, dtype=torch.bfloat16)
            dst = torch.empty_like(src)
            for f in FLUSHES:
                ms, p20, p80 = flushed_ms(functools.partial(dst.copy_, src), f)
                entries[f].update(ms=ms, ms_p20=p20, ms_p80=p80, gbps=gbps_of(2 * nbytes, ms))
            torch.cuda.synchronize()
            if not torch.equal(dst, src):
                raise RuntimeError("copy result differs from its source")
        except Exception as exc:  # noqa: BLE001
            for e in entries.values():
                e.update(gbps=None, error=_short(exc))
            _sync_quietly()
        src = dst = None  # free before the next size's buffers are allocated
        out.extend(entries.values())
    return out


def copy_rates(*measurements: list[dict]) -> dict[tuple[int, str], float]:
    """(buffer bytes, flush) -> the largest copy GB/s among the given measurement lists."""
    rates: dict[tuple[int, str], float] = {}
    for entries in measurements:
        for e in entries:
            key, g = (e["bytes_buffer"], e["flush"]), e.get("gbps")
            if g and g > rates.get(key, 0.0):
                rates[key] = g
    return rates


def used_copies(start: list[dict], end: list[dict]) -> list[dict]:
    """Per size and flush: start and end GB/s and the larger, which the shares use."""
    first = {(e["bytes_buffer"], e["flush"]): e.get("gbps") for e in start}
    last = {(e["bytes_buffer"], e["flush"]): e.get("gbps") for e in end}
    used = copy_rates(start, end)
    return [{"bytes_buffer": n, "bytes_moved": 2 * n, "flush": f, "start_gbps": first.get((n, f)),
             "end_gbps": last.get((n, f)), "gbps": used.get((n, f)), "fixed": n == COPY_BYTES}
            for n, f in sorted(set(first) | set(last), key=lambda k: (k[0], FLUSHES.index(k[1])))]


# --------------------------------------------------------------------------------------------
# Measuring one shape
# --------------------------------------------------------------------------------------------


def rel_error(y, ref, ref_norm) -> float:
    import torch

    if y.numel() != ref.numel():
        raise ValueError(f"output has {y.numel()} elements, expected {ref.numel()}")
    d = y.reshape(ref.shape).to(torch.float64) - ref
    return float(d.norm() / ref_norm)


def check_outputs(rec: dict, out, refs: tuple, ref_norms: tuple) -> None:
    """Set ``rec``'s errors and status from an implementation's outputs.

    Args:
        rec: the record, its ``tol`` set.
        out: y, or ``(y, h)`` for the fused add.
        refs: the float64 references, ``(y,)`` or ``(y, h)``.
        ref_norms: their L2 norms.

    ``rel_err`` is y's relative L2 error; with h also ``h_rel_err`` and ``h_max_abs_err``, the
    largest absolute difference from the rounded float64 sum (0 for a correctly rounded sum).
    The status is ok where every relative error is within the tolerance, else WRONG.
    """
    import torch

    outs = out if isinstance(out, tuple) else (out,)
    if len(outs) != len(refs):
        raise ValueError(f"{len(outs)} outputs, expected {len(refs)}")
    rec["out_dtype"] = str(outs[0].dtype).replace("torch.", "")
    rec["rel_err"] = rel_error(outs[0], refs[0], ref_norms[0])
    errors = [rec["rel_err"]]
    if len(refs) > 1:
        h, h_ref = outs[1], refs[1]
        rec["h_rel_err"] = rel_error(h, h_ref, ref_norms[1])
        rec["h_max_abs_err"] = float((h.reshape(h_ref.shape).to(torch.float64) - h_ref)
                                     .abs().max())
        errors.append(rec["h_rel_err"])
    ok = all(math.isfinite(e) and e <= rec["tol"] for e in errors)
    rec["status"] = "ok" if ok else "WRONG"


def largest_magnitude(out) -> float:
    """The largest |value| in the outputs; inf where one is not finite (NaN included)."""
    import torch

    outs = out if isinstance(out, tuple) else (out,)
    if not all(bool(torch.isfinite(t).all()) for t in outs):
        return math.inf
    return max(float(t.abs().max()) for t in outs)


def run_shape(shape: Shape, impls: Impls, names: list[str], seed: int, log) -> list[dict]:
    import torch

    recs = []
    dtype = _torch_dtype(shape.dtype)
    torch.manual_seed(seed)
    op = OPS[shape.op]
    x = torch.randn(shape.rows, shape.hidden, device=DEVICE, dtype=dtype)
    w = (1.0 + 0.1 * torch.randn(shape.hidden, device=DEVICE)).to(dtype)
    b = (0.1 * torch.randn(shape.hidden, device=DEVICE)).to(dtype) if op.has_bias else None
    r = torch.randn(shape.rows, shape.hidden, device=DEVICE, dtype=dtype) if (
        op.has_residual) else None
    ref = op.reference(impls.F, shape, x, w, b, EPS, r)
    refs = ref if isinstance(ref, tuple) else (ref,)
    ref_norms = tuple(t.norm() for t in refs)
    for impl in names:
        rec = new_record(shape, impl)
        try:
            fn, info = impls.make(impl, shape, x, w, b, EPS, r)
            restore = info.pop("restore", None)  # the in-place form's: puts its inputs back
            rec.update(info)
            t0 = time.perf_counter()
            out = _as_torch(fn())
            torch.cuda.synchronize()
            rec["first_call_s"] = time.perf_counter() - t0
            check_outputs(rec, out, refs, ref_norms)
            del out
            if shape.suite == "latency":
                measure_latency(rec, shape, fn, restore)
            else:
                # Both flushes back to back, so drift between them stays small: the read flush
                # is the primary number, the zeroing one compares with do_bench-era runs.
                ms, p20, p80 = flushed_ms(fn, "read", restore)
                rec.update(ms=ms, ms_p20=p20, ms_p80=p80, gbps=gbps_of(shape.bytes, ms))
                mz, z20, z80 = flushed_ms(fn, "zero", restore)
                rec.update(ms_zero=mz, ms_zero_p20=z20, ms_zero_p80=z80,
                           gbps_zero=gbps_of(shape.bytes, mz))
        except Unavailable as exc:
            rec["status"] = "unavailable"
            rec["error"] = str(exc)
        except Exception as exc:  # noqa: BLE001
            if rec["status"] != "WRONG":
                rec["status"] = "error"
            rec["error"] = _short(exc)
            rec["traceback"] = traceback.format_exc()[-3000:]
            _sync_quietly()
        recs.append(rec)
        log(progress_line(rec))
    del x, w, b, r, ref, refs
    torch.cuda.empty_cache()
    return recs


def measure_latency(rec: dict, shape: Shape, fn, restore=None) -> None:
    """Time ``fn`` by do_bench, CUDA-graph replay and host time into ``rec``.

    Each of the three launches ``fn`` back to back, so an in-place form (``restore`` given)
    runs on its own last outputs there: each launch adds the last y to the last h. Its inputs
    are put back before each of the three, and the largest |x| or |residual| after them is
    recorded (``max_abs_after_timing``; ``finite_after_timing``). In fp16 they overflow after
    some thousands of launches; the timing does not depend on the values.
    """
    peaks: list[float] = []

    def measured(measure):
        if restore is not None:
            restore()
        result = measure(fn)
        if restore is not None:
            peaks.append(largest_magnitude(_as_torch(fn())))
        return result

    ms, p20, p80 = measured(bench_ms)
    rec.update(ms=ms, ms_p20=p20, ms_p80=p80, gbps=gbps_of(shape.bytes, ms))
    try:
        g, _, _ = measured(graph_ms)
        rec["graph_us"] = g * 1e3
    except Exception as exc:  # noqa: BLE001
        rec["graph_error"] = _short(exc)
        _sync_quietly()
    try:
        rec["host_us"] = measured(host_us)
    except Exception as exc:  # noqa: BLE001
        rec["host_error"] = _short(exc)
        _sync_quietly()
    if peaks:
        rec["max_abs_after_timing"] = max(peaks)
        rec["finite_after_timing"] = math.isfinite(max(peaks))


def _sync_quietly() -> None:
    try:
        import torch

        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001, S110
        pass


def progress_line(r: dict) -> str:
    head = f"{r['suite']:7s} {r['dtype']} h={r['hidden']:<6d} rows={r['rows']:<6d} {r['impl']:8s}"
    if r["status"] in ("error", "unavailable", "skipped"):
        return f"{head} {r['status'].upper()}: {r.get('error')}"
    parts = [f"{r['status']:5s}", f"err={_fmt(r['rel_err'], '.1e')}"]
    if "h_rel_err" in r:
        parts.append(f"h err={_fmt(r['h_rel_err'], '.1e')} "
                     f"max|dh|={_fmt(r['h_max_abs_err'], '.1e')}")
    if r["ms"] is not None:
        parts.append(f"{r['ms'] * 1e3:9.1f} us")
    if r["gbps"] is not None:
        parts.append(f"{r['gbps']:6.0f} GB/s")
    if r.get("gbps_zero") is not None:
        parts.append(f"(zeroing flush {r['ms_zero'] * 1e3:.1f} us {r['gbps_zero']:.0f} GB/s)")
    if r.get("graph_us") is not None:
        parts.append(f"graph {r['graph_us']:.1f} us")
    if r.get("host_us") is not None:
        parts.append(f"host {r['host_us']:.1f} us")
    if r.get("path"):
        parts.append(f"path={r['path']}")
    if r.get("first_call_s") is not None and r["first_call_s"] > 1.0:
        parts.append(f"first call {r['first_call_s']:.1f} s")
    if "finite_after_timing" in r:
        parts.append(f"max |x|, |r| after timing {_fmt(r['max_abs_after_timing'], '.3g')}"
                     + ("" if r["finite_after_timing"] else " NOT FINITE"))
    return f"{head} " + "  ".join(parts)


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


# --------------------------------------------------------------------------------------------
# Summaries: shares, best peer, tables
# --------------------------------------------------------------------------------------------


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if (a and b) else None


def finalize(records: list[dict], rates: dict[tuple[int, str], float]) -> None:
    """Set the shares from copy GB/s keyed by (buffer bytes, flush), as ``copy_rates`` gives."""
    fixed_read, fixed_zero = rates.get((COPY_BYTES, "read")), rates.get((COPY_BYTES, "zero"))
    for r in records:
        if r["suite"] == "latency":
            # Timed by do_bench (zeroing flush): its share is over the fixed copy, same flush.
            r["share"] = _ratio(r["gbps"], fixed_zero)
            continue
        size = r.get("copy_bytes")
        r["share"] = _ratio(r["gbps"], rates.get((size, "read")))
        r["share_zero"] = _ratio(r.get("gbps_zero"), rates.get((size, "zero")))
        r["share_fixed_copy"] = _ratio(r["gbps"], fixed_read)


def group_by_shape(records: list[dict]) -> list[tuple[tuple, dict[str, dict]]]:
    groups: dict[tuple, dict[str, dict]] = {}
    for r in records:
        key = (r["suite"], r["dtype"], r["hidden"], r["rows"])
        groups.setdefault(key, {})[r["impl"]] = r

    def order(key: tuple) -> tuple:
        suite, dtype, hidden, rows = key
        return (ALL_SUITES.index(suite), DTYPES.index(dtype), hidden, rows)

    return sorted(groups.items(), key=lambda kv: order(kv[0]))


def best_peer(by_impl: dict[str, dict], metric: str, higher_is_better: bool):
    """Return (impl, value) of the best correct peer for ``metric``, or (None, None)."""
    best = (None, None)
    for name in PEERS:
        r = by_impl.get(name)
        if r is None or r["status"] != "ok" or r.get(metric) is None:
            continue
        v = r[metric]
        if best[1] is None or (v > best[1] if higher_is_better else v < best[1]):
            best = (name, v)
    return best


def _bw_cell(r: dict | None, zero: bool = False) -> str:
    """GB/s and % of copy (read flush), or only the % of copy under the zeroing flush."""
    if r is None:
        return ""
    if r["status"] in ("error", "unavailable", "skipped"):
        return {"error": "error", "unavailable": "n/a", "skipped": "skipped"}[r["status"]]
    gbps, share = (r.get("gbps_zero"), r.get("share_zero")) if zero else (r["gbps"], r["share"])
    if gbps is None:
        return r["status"]
    flag = " WRONG" if r["status"] == "WRONG" else ""
    if zero:
        return (f"{share * 100:3.0f}%" if share is not None else f"{gbps:5.0f}") + flag
    pct = f" {share * 100:3.0f}%" if share is not None else ""
    return f"{gbps:5.0f}{pct}{flag}"


def _lat_cell(r: dict | None) -> str:
    if r is None:
        return ""
    if r["status"] in ("error", "unavailable", "skipped"):
        return {"error": "error", "unavailable": "n/a", "skipped": "skipped"}[r["status"]]
    ms = r.get("ms")
    vals = [
        _fmt(None if ms is None else ms * 1e3, ".1f"),
        _fmt(r.get("graph_us"), ".1f"),
        _fmt(r.get("host_us"), ".1f"),
    ]
    flag = " WRONG" if r["status"] == "WRONG" else ""
    return "/".join(vals) + flag


def bandwidth_table(records: list[dict], names: list[str], zero: bool = False):
    """Rows of the bandwidth suites: read flush (GB/s and %), or ``zero``: % under that flush."""
    metric = "gbps_zero" if zero else "gbps"
    headers = ["suite", "dtype", "hidden", "rows"]
    headers += [f"{n} %copy" if zero else f"{n} GB/s %copy" for n in names]
    headers += ["best peer", "autonorm/best"]
    rows = []
    for (suite, dtype, hidden, nrows), by in group_by_shape(records):
        if suite == "latency":
            continue
        peer, peer_v = best_peer(by, metric, higher_is_better=True)
        an = by.get("autonorm")
        ratio = "-"
        if an is not None and an.get(metric) and peer_v:
            ratio = f"{an[metric] / peer_v:.2f}x" + (" WRONG" if an["status"] == "WRONG" else "")
        best = (peer if zero else f"{peer} {peer_v:.0f}") if peer else "-"
        rows.append([suite, dtype, str(hidden), str(nrows)]
                    + [_bw_cell(by.get(n), zero) for n in names] + [best, ratio])
    return headers, rows


def latency_table(records: list[dict], names: list[str]):
    headers = ["dtype", "hidden", "rows"] + [f"{n} us" for n in names]
    headers += ["best peer", "autonorm/best"]
    rows = []
    for (suite, dtype, hidden, nrows), by in group_by_shape(records):
        if suite != "latency":
            continue
        an = by.get("autonorm")
        bests, ratios = [], []
        for metric in ("ms", "graph_us", "host_us"):
            peer, v = best_peer(by, metric, higher_is_better=False)
            bests.append(f"{peer}" if peer else "-")
            mine = an.get(metric) if an is not None and an["status"] in ("ok", "WRONG") else None
            ratios.append(f"{mine / v:.2f}" if (mine and v) else "-")
        rows.append([dtype, str(hidden), str(nrows)] + [_lat_cell(by.get(n)) for n in names]
                    + ["/".join(bests), "/".join(ratios)])
    return headers, rows


def render_table(title: str, headers: list[str], rows: list[list[str]], plain: bool) -> None:
    if not rows:
        return
    if not plain:
        try:
            from rich import box
            from rich.console import Console
            from rich.table import Table
        except ImportError:
            plain = True
    if not plain:
        print(title)
        table = Table(box=box.SIMPLE_HEAD)
        for i, h in enumerate(headers):
            table.add_column(h, justify="left" if i < 2 else "right", no_wrap=True)
        for row in rows:
            table.add_row(*row)
        console = Console(width=300, soft_wrap=False, no_color=True, highlight=False)
        with console.capture() as cap:
            console.print(table)
        print("\n".join(line.rstrip() for line in cap.get().splitlines()))
        return
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    print(title)
    print("  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
    print()


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:g} MiB"


def copy_lines(copy: dict) -> list[str]:
    """Copy GB/s per buffer size and flush (start, end, the larger used), for the summary."""
    used = copy.get("used") or used_copies(copy.get("start") or [], copy.get("end") or [])
    if not used:
        return ["copy bandwidth: not measured"]
    lines = ["copy GB/s (device-to-device, bytes moved = 2 x buffer; shares use the larger of "
             "start/end):"]
    for n in sorted({u["bytes_buffer"] for u in used}):
        cells = []
        for u in (u for u in used if u["bytes_buffer"] == n):
            cells.append(f"{u['flush']} flush {_fmt(u['gbps'], '.0f')} (start "
                         f"{_fmt(u['start_gbps'], '.0f')}, end {_fmt(u['end_gbps'], '.0f')})")
        ref = " (fixed reference)" if n == COPY_BYTES else ""
        lines.append(f"  buffer {_mib(n):>8s}{ref}: " + "; ".join(cells))
    return lines


def residual_lines(records: list[dict]) -> list[str]:
    """The fused add's h check per implementation and how far the in-place form's values grew.

    Nothing for ops without a residual.
    """
    checked = [r for r in records if r.get("h_max_abs_err") is not None]
    if not checked:
        return []
    cells = []
    for impl in (i for i in ALL_IMPLS if any(r["impl"] == i for r in checked)):
        diffs = [r["h_max_abs_err"] for r in checked if r["impl"] == impl]
        worst = math.inf if any(math.isnan(d) for d in diffs) else max(diffs)  # NaN: an h with NaN
        exact = sum(d == 0 for d in diffs)
        cells.append(f"{impl} {worst:.2g} ({exact}/{len(diffs)} shapes exact)")
    lines = ["h = x + residual: largest |h - the float64 sum rounded to the dtype| over the "
             "shapes: " + "; ".join(cells)]
    grown = [r for r in records if "finite_after_timing" in r]
    if grown:
        peak = max((r["max_abs_after_timing"] for r in grown if r["finite_after_timing"]),
                   default=None)
        bad = [f"{r['dtype']} rows={r['rows']}" for r in grown if not r["finite_after_timing"]]
        lines.append("in place: inputs put back before each timed launch (sweep, llm) and each "
                     "latency measurement, which launches back to back; largest |x|, |residual| "
                     f"after one: {_fmt(peak, '.3g')}, "
                     + (f"NOT FINITE at {', '.join(bad)} (the timing does not depend on the "
                        "values)" if bad else "finite at every shape"))
    return lines


def print_summary(meta: dict, records: list[dict], names: list[str], plain: bool) -> None:
    bad = [r for r in records if r["status"] in ("error", "WRONG")]
    if bad:
        print("\nProblems (full text and tracebacks in peers.json):")
        for r in bad[:MAX_PROBLEM_LINES]:
            extra = f"rel_err={_fmt(r['rel_err'], '.2e')} tol={r['tol']:.0e}"
            if "h_rel_err" in r:
                extra += f" h_rel_err={_fmt(r['h_rel_err'], '.2e')}"
            msg = r["error"] if r["status"] == "error" else extra
            print(f"  {r['impl']:8s} {r['suite']} {r['dtype']} h={r['hidden']} rows={r['rows']}: "
                  f"{r['status']}: {msg}")
        if len(bad) > MAX_PROBLEM_LINES:
            print(f"  ... and {len(bad) - MAX_PROBLEM_LINES} more")
    unavailable = {r["impl"]: r["error"] for r in records if r["status"] == "unavailable"}
    for impl, why in unavailable.items():
        print(f"  {impl} unavailable: {why}")
    paths = sorted({r["path"] for r in records
                    if r["impl"] in ("autonorm", *IN_PLACE_IMPLS) and r.get("path")})
    copy = meta.get("copy", {})
    print()
    print(f"device: {meta.get('device')}  torch {meta.get('torch')}  triton {meta.get('triton')}"
          f"  liger {meta.get('liger')}")
    for line in copy_lines(copy):
        print(line)
    if paths:
        print(f"autonorm called through: {', '.join(paths)}")
    for line in residual_lines(records):
        print(line)
    print(f"wrote {meta.get('json_path')} and {meta.get('png_path') or '(no plot)'}")
    print()
    op = meta.get("op", DEFAULT_OP)
    title = OPS[op].title
    latency = "Latency" if op == DEFAULT_OP else f"{title} latency"
    h, rows = latency_table(records, names)
    sizes = sorted({r["hidden"] for r in records if r["suite"] == "latency"}) or [LATENCY_HIDDEN]
    render_table(f"{latency}, hidden {', '.join(map(str, sizes))}: do_bench (L2 flushed) / "
                 "CUDA graph / host-inclusive, us; best peer and autonorm/best per metric "
                 "(<1 = autonorm faster)", h, rows, plain)
    h, rows = bandwidth_table(records, names)
    render_table(f"{title}: GB/s and % of copy bandwidth (median of single launches, "
                 "L2 flushed by a read; copy of the same bytes); autonorm/best > 1 = autonorm "
                 "faster", h, rows, plain)
    h, rows = bandwidth_table(records, names, zero=True)
    render_table("The same launches after do_bench's zeroing flush (dirty L2 written back in "
                 "each launch): % of a copy of the same bytes under that flush; autonorm/best "
                 "by GB/s", h, rows, plain)


# --------------------------------------------------------------------------------------------
# Output files
# --------------------------------------------------------------------------------------------


def _clean(obj):
    """Replace non-finite floats with None so the JSON is standard."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def write_json(path: Path, meta: dict, records: list[dict], complete: bool) -> None:
    data = {"meta": dict(meta, complete=complete), "measurements": records}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(_clean(data), indent=1, default=str))
    os.replace(tmp, path)


def write_plot(path: Path, meta: dict, records: list[dict], names: list[str]) -> str | None:
    """One panel per dtype: share of copy bandwidth vs hidden size. Returns an error or None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:  # noqa: BLE001
        return f"matplotlib unavailable: {_short(exc)}"
    sweep = [r for r in records if r["suite"] == "sweep" and r.get("share") is not None]
    dtypes = [d for d in DTYPES if any(r["dtype"] == d for r in sweep)]
    if not dtypes:
        return "no sweep measurement with a share to plot"
    fig, axes = plt.subplots(1, len(dtypes), figsize=(6 * len(dtypes), 5.0), squeeze=False,
                             sharey=True)
    handles: dict[str, object] = {}
    top = 100.0
    for ax, dt in zip(axes[0], dtypes, strict=True):
        hiddens = sorted({r["hidden"] for r in sweep if r["dtype"] == dt})
        for name in names:
            pts = sorted((r["hidden"], r["share"] * 100, r["status"]) for r in sweep
                         if r["dtype"] == dt and r["impl"] == name)
            if not pts:
                continue
            top = max(top, *(p[1] for p in pts))
            lw = 2.6 if name in ("autonorm", *IN_PLACE_IMPLS) else 1.4
            ls = "--" if name in IN_PLACE_IMPLS else "-"
            (line,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=4, lw=lw,
                              ls=ls, color=COLORS.get(name), label=name)
            handles.setdefault(name, line)
            wrong = [p for p in pts if p[2] == "WRONG"]
            if wrong:
                mark = ax.scatter([p[0] for p in wrong], [p[1] for p in wrong], marker="x", s=90,
                                  color="black", zorder=5, label="WRONG (error over tolerance)")
                handles.setdefault("WRONG", mark)
        ref = ax.axhline(TARGET_SHARE * 100, color="gray", ls="--", lw=1, label="95% of copy")
        handles.setdefault("95%", ref)
        ax.set_xscale("log", base=2)
        ax.set_xticks(hiddens)
        ax.set_xticklabels([str(h) for h in hiddens], rotation=45, fontsize=8)
        ax.minorticks_off()
        ax.set_title(f"{dt}, rows = 2^26 / hidden")
        ax.set_xlabel("hidden size")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("% of copy of the same bytes (L2 flushed by a read, median)")
    axes[0][0].set_ylim(0, top * 1.05)
    order = [k for k in handles if k not in ("WRONG", "95%")] + [
        k for k in ("WRONG", "95%") if k in handles
    ]
    fig.legend([handles[k] for k in order], [handles[k].get_label() for k in order],
               loc="lower center", ncol=len(order), fontsize=9, frameon=False)
    used = meta.get("copy", {}).get("used") or []
    sizes = {r["copy_bytes"] for r in sweep}
    rates = [u["gbps"] for u in used
             if u["flush"] == "read" and u["bytes_buffer"] in sizes and u["gbps"]]
    lo, hi = (f"{min(rates):.0f}", f"{max(rates):.0f}") if rates else ("-", "-")
    span = lo if lo == hi else f"{lo}-{hi}"
    title = OPS[meta.get("op", DEFAULT_OP)].title
    fig.suptitle(f"{title} on {meta.get('device')}: share of a copy of the same bytes, "
                 f"L2 flushed by a read (copy {span} GB/s)")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def collect_meta(args: argparse.Namespace) -> dict:
    import torch

    op = OPS[args.op]
    copied = "x and the residual" if op.has_residual else "x"
    meta: dict = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "argv": sys.argv,
        # A LayerNorm run names no op (nor do its records): LayerNorm results keep one format.
        "args": {k: v for k, v in vars(args).items() if k != "op" or v != DEFAULT_OP},
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "eps": EPS,
        "tolerances": TOL,
        "method": {
            "bench": f"triton.testing.do_bench warmup={BENCH_WARMUP_MS} rep={BENCH_REP_MS} "
                     f"quantiles={QUANTILES} (median first; L2 flushed before each call); "
                     "latency suite only",
            "flushed": f"sweep and llm suites: single launches between CUDA events, each after "
                       f"a flush; warm-up about {BENCH_WARMUP_MS} ms, repeats covering about "
                       f"{BENCH_REP_MS} ms of kernel time ({FLUSH_MIN_REPS} to "
                       f"{FLUSH_MAX_REPS}); median, p20, p80. Each launch is timed under both "
                       "flushes, one right after the other",
            "flush_read": f"primary (ms, gbps, share): sum a {FLUSH_BYTES // 2**20} MiB int32 "
                          "buffer before each launch; inputs are evicted and the L2 holds only "
                          "clean lines, so nothing is written back during the launch",
            "flush_zero": "secondary (ms_zero, gbps_zero, share_zero): zero the same buffer, "
                          "as do_bench does; the L2 is left full of dirty lines whose write-back "
                          "lands in the timed launch, 4-6 us per launch on an H200, which weighs "
                          "more on shorter launches; kept to compare with earlier runs",
            "graph": f"triton.testing.do_bench_cudagraph rep={GRAPH_REP_MS} (L2 not flushed)",
            "host": f"wall time of {HOST_CALLS} back-to-back calls after a sync, median of "
                    f"{HOST_REPEATS}",
            "bytes": f"rows*hidden*itemsize*{op.row_streams} + {op.vectors}*hidden*itemsize",
            "share": "GB/s over the GB/s of a device-to-device copy of the same bytes as "
                     f"{copied} "
                     f"(rounded to {COPY_ROUND // 2**20} MiB; bytes moved = 2 x buffer), timed "
                     "under the same flush in the same run (larger of start and end). Latency "
                     f"suite: over the fixed {COPY_BYTES // 2**20} MiB copy, zeroing flush",
            "share_zero": "gbps_zero over the zeroing-flush copy of the same bytes",
            "share_fixed_copy": f"gbps (read flush) over the read-flush copy of the fixed "
                                f"{COPY_BYTES // 2**20} MiB buffer, the yardstick of earlier runs",
        },
    }
    meta.update(op_fields(args.op))
    try:
        import triton

        meta["triton"] = triton.__version__
    except Exception as exc:  # noqa: BLE001
        meta["triton"] = f"unavailable: {_short(exc)}"
    try:
        import cupy

        meta["cupy"] = cupy.__version__
    except Exception:  # noqa: BLE001
        meta["cupy"] = None
    try:
        props = torch.cuda.get_device_properties(0)
        meta["device"] = props.name
        meta["capability"] = f"{props.major}.{props.minor}"
        meta["sm_count"] = props.multi_processor_count
        meta["memory_gib"] = round(props.total_memory / 2**30, 1)
        meta["l2_bytes"] = getattr(props, "L2_cache_size", None)
    except Exception as exc:  # noqa: BLE001
        meta["device"] = f"? ({_short(exc)})"
    return meta


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.selftest:
        return selftest(args)
    start = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out / "peers.json", out / "peers.png"

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - start:6.1f}s] {msg}", flush=True)

    faulthandler.enable()  # a hard crash still prints where it happened
    import torch

    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("peers.py needs a CUDA GPU (try --selftest)", file=sys.stderr)
        return 2
    torch.set_grad_enabled(False)
    meta = collect_meta(args)
    impls = Impls(args.impls, args.liger_wheel, args.op)
    meta["liger"] = impls.versions.get("liger")
    meta["autonorm"] = impls.versions.get("autonorm")
    meta["unavailable"] = impls.unavailable
    meta["notes"] = impls.notes
    meta["json_path"], meta["png_path"] = str(json_path), str(png_path)
    for name, why in impls.unavailable.items():
        log(f"{name} unavailable: {why}")

    shapes = build_shapes(args)
    log(f"{len(shapes)} shapes x {len(args.impls)} implementations on {meta.get('device')}")
    sizes = copy_sizes(shapes)
    copy_start = measure_copies(sizes)
    for line in copy_lines({"start": copy_start}):
        log(line)
    meta["copy"] = {"sizes": sizes, "fixed_bytes_buffer": COPY_BYTES, "start": copy_start}
    rates = copy_rates(copy_start)

    records: list[dict] = []
    for i, shape in enumerate(shapes):
        if time.perf_counter() - start > args.budget_s:
            for impl in args.impls:
                rec = new_record(shape, impl)
                rec["status"] = "skipped"
                rec["error"] = f"time budget of {args.budget_s:.0f} s spent"
                records.append(rec)
            continue
        try:
            records.extend(run_shape(shape, impls, args.impls, seed=1000 + i, log=log))
        except Exception as exc:  # noqa: BLE001 - e.g. out of memory making the inputs
            log(f"{shape.label()}: shape failed: {_short(exc)}")
            for impl in args.impls:
                rec = new_record(shape, impl)
                rec["error"] = f"shape setup failed: {_short(exc)}"
                records.append(rec)
            _sync_quietly()
        finalize(records, rates)
        try:
            write_json(json_path, meta, records, complete=False)
        except Exception as exc:  # noqa: BLE001
            log(f"could not write {json_path}: {_short(exc)}")

    copy_end = measure_copies(sizes)
    meta["copy"]["end"] = copy_end
    meta["copy"]["used"] = used_copies(copy_start, copy_end)
    meta["copy"]["note"] = ("each share uses the larger of the start and end copy GB/s of its "
                            "size and flush")
    finalize(records, copy_rates(copy_start, copy_end))
    meta["wall_s"] = time.perf_counter() - start
    try:
        err = write_plot(png_path, meta, records, args.impls)
    except Exception as exc:  # noqa: BLE001
        err = f"plot failed: {_short(exc)}"
    if err:
        meta["png_path"] = None
        meta["plot_error"] = err
        log(f"no plot: {err}")
    write_json(json_path, meta, records, complete=True)
    print_summary(meta, records, args.impls, args.plain)
    print(f"total {meta['wall_s']:.0f} s")
    return 0


# --------------------------------------------------------------------------------------------
# Self-test without a GPU
# --------------------------------------------------------------------------------------------


def synthetic_copies(sizes: list[int], read_gbps: float, writeback_us: float) -> list[dict]:
    """Copy entries as measure_copies returns them: one rate, plus a fixed zero-flush cost."""
    out = []
    for n in sizes:
        t_read = 2 * n / (read_gbps * 1e9) * 1e3
        for f, ms in (("read", t_read), ("zero", t_read + writeback_us * 1e-3)):
            out.append({"bytes_buffer": n, "bytes_moved": 2 * n, "flush": f, "ms": ms,
                        "ms_p20": ms * 0.99, "ms_p80": ms * 1.01, "gbps": gbps_of(2 * n, ms)})
    return out


def synthetic_records(shapes: list[Shape], names: list[str],
                      rates: dict[tuple[int, str], float]) -> list[dict]:
    rng = random.Random(0)
    records = []
    for si, shape in enumerate(shapes):
        for impl in names:
            rec = new_record(shape, impl)
            if impl == "liger" and si % 7 == 3:
                rec["status"], rec["error"] = "unavailable", "ModuleNotFoundError: liger_kernel"
                records.append(rec)
                continue
            if impl == "compile" and si % 9 == 4:
                rec["error"] = "BackendCompilerFailed: synthetic failure"
                records.append(rec)
                continue
            share = rng.uniform(0.3, 0.97)
            if shape.suite == "latency":
                ms = shape.bytes / (share * rates[(COPY_BYTES, "zero")] * 1e9) * 1e3 + 0.004
                rec["graph_us"] = ms * 1e3 * 0.8
                rec["host_us"] = ms * 1e3 + rng.uniform(2, 20)
            else:
                ms = shape.bytes / (share * rates[(shape.copy_bytes, "read")] * 1e9) * 1e3
                # The zeroing flush's write-back: a fixed few us per launch.
                mz = ms + rng.uniform(0.004, 0.006)
                rec.update(ms_zero=mz, ms_zero_p20=mz * 0.98, ms_zero_p80=mz * 1.03,
                           gbps_zero=gbps_of(shape.bytes, mz))
            err = rng.uniform(1e-4, 4e-3) if shape.dtype != "fp32" else rng.uniform(1e-8, 1e-7)
            if impl == "triton" and si % 5 == 2:
                err = float("nan")
            rec.update(rel_err=err, ms=ms, ms_p20=ms * 0.98, ms_p80=ms * 1.03,
                       gbps=gbps_of(shape.bytes, ms), first_call_s=rng.uniform(0.01, 3.0),
                       out_dtype=shape.dtype)
            rec["status"] = "ok" if (math.isfinite(err) and err <= rec["tol"]) else "WRONG"
            if OPS[shape.op].has_residual:  # a sum rounded once: h exact
                rec.update(h_rel_err=0.0, h_max_abs_err=0.0)
            if impl in IN_PLACE_IMPLS and shape.suite == "latency":
                rec.update(max_abs_after_timing=rng.uniform(50.0, 500.0), finite_after_timing=True)
            if impl in ("autonorm", *IN_PLACE_IMPLS):
                rec["path"] = "torch" if si % 2 else "dlpack"
            records.append(rec)
    return records


def selftest(args: argparse.Namespace) -> int:
    # Parsing checks.
    q = parse_args(["--quick", "--selftest"])
    assert q.hidden == list(QUICK_HIDDEN) and q.dtypes == list(QUICK_DTYPES), q
    a = parse_args(["--dtypes", "fp16", "--hidden", "512,768", "--suites", "sweep,llm",
                    "--impls", "eager,autonorm", "--selftest"])
    assert a.dtypes == ["fp16"] and a.hidden == [512, 768] and a.impls == ["eager", "autonorm"]
    assert [s.suite for s in build_shapes(a)] == ["llm", "llm", "sweep", "sweep"]
    for bad in (["--dtypes", "fp8"], ["--hidden", "x"], ["--impls", "cudnn"], ["--suites", ""],
                ["--op", "group_norm"], ["--op", "rms_norm", "--impls", "eager,triton"],
                ["--impls", "autonorm-inplace"], ["--op", "add_rms_norm", "--impls", "triton"]):
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                parse_args(bad)
        except SystemExit:
            pass
        else:
            raise AssertionError(f"accepted {bad}")
    full = build_shapes(parse_args(["--selftest"]))
    assert len(full) == 9 * 3 + 4 + 2, len(full)
    # Hidden 768 and 12288 are a few KiB short of 2^27 / 2^28 bytes: they share those copies.
    assert copy_sizes(full) == [2**25, 2**26, 2**27, 2**28], copy_sizes(full)
    assert Shape("latency", "bf16", 16384, 8).copy_bytes is None
    assert rep_count(0.07, BENCH_REP_MS) == FLUSH_MAX_REPS
    assert rep_count(10.0, BENCH_REP_MS) == FLUSH_MIN_REPS
    assert rep_count(0.2, BENCH_REP_MS) == 500
    assert summarize_ms([5.0, 1.0, 3.0, 2.0, 4.0]) == (3.0, 1.8, 4.2)
    s = Shape("sweep", "bf16", 4096, 2**26 // 4096)
    assert s.bytes == 2**26 * 2 * 2 + 2 * 4096 * 2
    # RMSNorm: its peers (no Triton tutorial), its shapes, one hidden-sized vector (the weight).
    r = parse_args(["--op", "rms_norm", "--quick", "--selftest"])
    assert r.impls == ["autonorm", "eager", "compile", "liger"], r.impls
    assert {sh.op for sh in build_shapes(r)} == {"rms_norm"}
    assert Shape("sweep", "fp32", 4096, 2**26 // 4096, "rms_norm").bytes == (
        2**26 * 4 * 2 + 4096 * 4)
    assert new_record(Shape("llm", "bf16", 4096, 4096, "rms_norm"), "eager")["op"] == "rms_norm"
    assert "op" not in new_record(s, "eager")  # LayerNorm records are as they always were
    # Fused add + RMSNorm: x and the residual read and y and h written once, the weight read
    # once; its share is over a copy of x's and the residual's bytes (the same bytes moved).
    f = parse_args(["--op", "add_rms_norm", "--quick", "--selftest"])
    assert f.impls == ["autonorm", "autonorm-inplace", "eager", "compile", "liger"], f.impls
    fused = Shape("sweep", "bf16", 4096, 2**26 // 4096, "add_rms_norm")
    assert fused.bytes == 2**26 * 2 * 4 + 4096 * 2, fused.bytes
    assert fused.copy_bytes == 2 * Shape("sweep", "bf16", 4096, 2**26 // 4096).copy_bytes == 2**28
    fused_rec = new_record(fused, "autonorm-inplace")
    assert fused_rec["op"] == "add_rms_norm" and fused_rec["h_max_abs_err"] is None, fused_rec
    assert "h_rel_err" not in new_record(s, "eager")
    for name, op in OPS.items():
        assert op.impls == tuple(i for i in ALL_IMPLS if i in op.impls), name
        assert "autonorm" in op.impls and op.vectors == 1 + op.has_bias, name
        assert op.row_streams == 2 + 2 * op.has_residual, name
        assert (op.in_place_call is not None) == any(i in IN_PLACE_IMPLS for i in op.impls), name
    assert abs(gbps_of(10**9, 1.0) - 1000.0) < 1e-9

    # Timing-helper plumbing with fake benchmark functions of each signature.
    def new_api(fn, warmup=25, rep=100, grad_to_none=None, quantiles=None, return_mode="mean"):
        return [1.0, 0.9, 1.2] if quantiles else 1.1

    def mode_api(fn, warmup=25, rep=100, return_mode="mean"):
        return 2.0 if return_mode == "median" else 9.9

    def old_api(fn, warmup=25, rep=100, percentiles=(0.2, 0.8)):
        return (3.0, 2.9, 3.1)

    assert _call_bench(new_api, None, warmup=1, rep=1) == (1.0, 0.9, 1.2)
    assert _call_bench(mode_api, None, warmup=1, rep=1) == (2.0, None, None)
    assert _call_bench(old_api, None, warmup=1, rep=1) == (3.0, None, None)

    # Tables, JSON, plot on synthetic numbers.
    shapes = build_shapes(args)
    names = list(args.impls)
    sizes = copy_sizes(shapes)
    copy_start = synthetic_copies(sizes, 4250.0, 5.0)
    copy_end = synthetic_copies(sizes, 4230.0, 5.5)
    rates = copy_rates(copy_start, copy_end)
    # The larger of start and end is used; the zeroing flush's fixed cost lowers that copy.
    assert rates[(COPY_BYTES, "read")] == 4250.0, rates
    assert rates[(COPY_BYTES, "zero")] < rates[(COPY_BYTES, "read")], rates
    records = synthetic_records(shapes, names, rates)
    records.append(dict(new_record(Shape("llm", "bf16", 8192, 4096, args.op), "autonorm"),
                        status="skipped", error="time budget of 520 s spent"))
    finalize(records, rates)
    bw_ok = [r for r in records if r["suite"] != "latency" and r["status"] == "ok"]
    assert bw_ok or not any(s.suite != "latency" for s in shapes)
    for r in bw_ok:
        for key in ("share", "share_zero", "share_fixed_copy", "gbps_zero", "ms_zero"):
            assert r[key] is not None and math.isfinite(r[key]), (key, r)
    assert all(r["share_zero"] is None for r in records if r["suite"] == "latency")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "device": "SYNTHETIC (selftest)", "torch": "-", "triton": "-", "liger": "-",
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "copy": {"sizes": sizes, "fixed_bytes_buffer": COPY_BYTES, "start": copy_start,
                 "end": copy_end, "used": used_copies(copy_start, copy_end)},
        "json_path": str(out / "peers.json"), "png_path": str(out / "peers.png"),
        **op_fields(args.op),
    }
    for r in records[:8] + bw_ok[:4]:
        print(progress_line(r))
    err = write_plot(out / "peers.png", meta, records, names)
    if err:
        print(f"plot: {err}")
        meta["png_path"] = None
    write_json(out / "peers.json", meta, records, complete=True)
    loaded = json.loads((out / "peers.json").read_text())
    assert len(loaded["measurements"]) == len(records)
    assert {m.get("op", DEFAULT_OP) for m in loaded["measurements"]} == {args.op}
    assert any(m["rel_err"] is None and m["status"] == "WRONG" for m in loaded["measurements"]) \
        or "triton" not in names
    assert all(m["share"] is not None for m in loaded["measurements"]
               if m["suite"] != "latency" and m["status"] == "ok")
    residual = OPS[args.op].has_residual
    assert all(("h_max_abs_err" in m) == residual for m in loaded["measurements"])
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        print_summary(meta, records, names, plain=True)
    summary = text.getvalue()
    print(summary, end="")
    if any(s.suite != "latency" for s in shapes):
        for needle in ("L2 flushed by a read; copy of the same bytes", "do_bench's zeroing flush",
                       "read flush", "zero flush", "(fixed reference)",
                       f"{OPS[args.op].title}: GB/s and % of copy bandwidth"):
            assert needle in summary, needle
    if residual:
        assert "h = x + residual: largest |h - the float64 sum" in summary
        assert ("in place: inputs put back before each timed launch" in summary) == (
            any(i in IN_PLACE_IMPLS for i in names) and any(sh.suite == "latency" for sh in shapes))
    else:
        assert "h = x + residual" not in summary
    print_summary(meta, records, names, plain=args.plain)
    of = "" if args.op == DEFAULT_OP else f" of {args.op}"
    print(f"selftest ok: {len(records)} synthetic rows{of}; files in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
