"""The peers benchmark's command line: its options, their checks and their defaults."""

from __future__ import annotations

import argparse
import tempfile

from .constants import (
    ALL_IMPLS,
    ALL_SUITES,
    DEFAULT_OP,
    DTYPES,
    HERE,
    LATENCY_HIDDEN,
    LATENCY_ROWS,
    QUICK_DTYPES,
    QUICK_HIDDEN,
    SWEEP_HIDDEN,
)
from .ops import OPS


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
