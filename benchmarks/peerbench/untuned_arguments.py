"""untuned.py's command line: its options, their checks and their defaults."""

from __future__ import annotations

import argparse
from pathlib import Path

from .untuned_constants import DTYPES, MODES, SMALL_ROWS


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"give positive integers, e.g. 1,16,64,256, not {text!r}")
    return values


def _choices(text: str, allowed: tuple[str, ...]) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in allowed]
    if bad or not items:
        raise argparse.ArgumentTypeError(
            f"{', '.join(bad) or '(empty)'} not in {', '.join(allowed)}")
    return items


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="untuned.py",
        description=(
            "Benchmark autonorm's LayerNorm forward at hidden sizes nobody tuned (drawn with a\n"
            "seed from 256 to 65,536, a third of them not a multiple of 8, none in the shipped\n"
            "database), at rows = 2^26 / hidden and at small row counts, in bf16, fp16 and\n"
            "fp32, against PyTorch eager, torch.compile and Liger in the same run: autonorm\n"
            "untuned (shipped database on), with no shipped database, and after tuning each\n"
            "shape. Prints a markdown table per dtype and the summary figures. Needs a CUDA GPU\n"
            "(--plan does not). Method: docs/timing.md."
        ),
        epilog=(
            "examples:\n"
            "  python benchmarks/untuned.py --json out/untuned.json\n"
            "      everything (H200: 6.5 min of tuning, then about 2.5 for the shapes of 2^26\n"
            "      elements and one row, and more for 64 and 256 rows)\n"
            "  python benchmarks/untuned.py --tune-only --tuned-db tuned.db, then\n"
            "  python benchmarks/untuned.py --tuned-db tuned.db --json out/untuned.json\n"
            "      the same in two commands, for a machine that limits a command's time\n"
            "      (with --budget-s 540, say, under a 10-minute limit)\n"
            "  python benchmarks/untuned.py --count 3 --dtypes bf16 --small-rows 1\n"
            "  python benchmarks/untuned.py --modes shipped,no-shipped   no tuning phase\n"
            "  python benchmarks/untuned.py --plan                   the shapes, without a GPU"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the hidden sizes (default 0)")
    p.add_argument("--count", type=int, default=9, help="hidden sizes to draw (default 9)")
    p.add_argument("--hidden", type=lambda s: _int_list(s), default=None,
                   help="measure these hidden sizes instead of a draw (e.g. 490,3556)")
    p.add_argument("--dtypes", type=lambda s: _choices(s, DTYPES),
                   default=list(DTYPES), help="bf16,fp16,fp32 (default all three)")
    p.add_argument("--modes", type=lambda s: _choices(s, MODES), default=list(MODES),
                   help="autonorm's modes: shipped,no-shipped,tuned (default all three)")
    p.add_argument("--small-rows", type=lambda s: _int_list(s),
                   default=list(SMALL_ROWS), help="small row counts (1 to 256), timed by "
                   "CUDA-graph replay (default 1,64,256)")
    p.add_argument("--no-small", action="store_true", help="skip the small row counts")
    p.add_argument("--no-bulk", action="store_true",
                   help="skip the shapes of 2^26 elements (only the small row counts)")
    p.add_argument("--tune-timeout", type=float, default=4.0,
                   help="search seconds per bulk shape in the tuned mode (default 4)")
    p.add_argument("--tune-odd", action="store_true",
                   help="tune the odd bulk shapes too (default: only the multiples of 8)")
    p.add_argument("--tune-trials", type=int, default=40,
                   help="candidates measured at most per bulk shape (default 40)")
    p.add_argument("--tuned-db", type=Path, default=None,
                   help="the tuned mode's database, tuned into as each shape finishes: "
                        "shapes it already holds a current winner of are not tuned again, "
                        "so a run cut short resumes")
    p.add_argument("--tune-only", action="store_true",
                   help="tune (into --tuned-db) and exit without measuring")
    p.add_argument("--budget-s", type=float, default=0.0,
                   help="after this many seconds the shapes not yet measured are skipped, "
                        "for a command under a time limit (default 0: no limit)")
    p.add_argument("--json", type=Path, default=None,
                   help="write every number here (rewritten after each shape)")
    p.add_argument("--liger-wheel", default="auto",
                   help="as in peers.py: 'auto', a wheel path, or 'none'")
    p.add_argument("--plan", action="store_true",
                   help="print the drawn shapes and the work, then exit (no GPU needed)")
    args = p.parse_args(argv)
    if args.count < 1:
        p.error(f"--count: give at least 1, got {args.count}")
    if not (args.tune_timeout > 0 and args.tune_trials >= 1 and args.budget_s >= 0):
        p.error("--tune-timeout must be > 0, --tune-trials >= 1 and --budget-s >= 0")
    if args.no_small:
        args.small_rows = []
    if max(args.small_rows, default=1) > 256:
        p.error("--small-rows: give row counts from 1 to 256")
    if args.no_bulk and not args.small_rows:
        p.error("--no-bulk with --no-small leaves nothing to measure")
    return args
