"""Compile the untuned defaults of a grid offline with nvcc and list those that spill (no GPU).

Run from the repository root on any machine with nvcc::

    python benchmarks/default_spills.py --ops layer_norm_backward,rms_norm_backward \\
        --hidden 1001,4001,7001,10001,12001 --rows grid,64

For every form of each op (the weight and bias flags, the weight offset, the fused add), every dtype
of ``--dtypes``, each hidden size and row count, the family's default for the GPU kind of ``--arch``
(an H200's limits for sm_90) is rendered, and the distinct kernels are compiled in one batch
(``autonorm.runtime.offline``): ``ptxas -v`` gives each one's registers and spills. A spill reads
and writes local memory on every use (docs/registers.md); the tuner times such a kernel like any
other, but dispatch of an untuned shape has no timing to go by. Prints the count of kernels and
launches that spill, then each spilling kernel with its registers, spill bytes and the shapes that
take it, and the leaner pick that dispatch runs in its place (:mod:`autonorm.fallback`), compiled
the same way.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import sys
from typing import Any

# The forms of each op's problem: the fields besides hidden and dtype.
FORMS: dict[str, tuple[dict[str, Any], ...]] = {
    "layer_norm": ({}, {"has_bias": False}, {"has_weight": False, "has_bias": False},
                   {"residual": True}, {"residual": True, "residual_dtype": "float32"}),
    "rms_norm": ({}, {"weight_offset": True}, {"has_weight": False}, {"residual": True},
                 {"residual": True, "residual_dtype": "float32"}),
    "layer_norm_backward": ({}, {"has_bias": False}, {"has_weight": False, "has_bias": False},
                            {"residual": True}),
    "rms_norm_backward": ({}, {"weight_offset": True}, {"has_weight": False},
                          {"residual": True}),
}
GRID = "grid"  # the --rows entry for the benchmark's row count, 2^26 // hidden


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line (no GPU and no nvcc needed for ``--help``)."""
    parser = argparse.ArgumentParser(
        description="Compile the untuned default kernel of every form, dtype, hidden size and "
                    "row count of a grid offline with nvcc, and list the defaults that spill "
                    "registers to local memory.")
    parser.add_argument("--ops", default="layer_norm_backward,rms_norm_backward",
                        help=f"comma-separated ops of {', '.join(FORMS)} "
                             "(default: the two backwards)")
    parser.add_argument("--dtypes", default="bf16,fp16,fp32",
                        help="comma-separated dtypes (default: bf16,fp16,fp32)")
    parser.add_argument("--hidden", default="1001,4001,7001,10001,12001",
                        help="comma-separated hidden sizes (default: odd sizes 1001-12001)")
    parser.add_argument("--rows", default=f"{GRID},64",
                        help=f"comma-separated row counts; '{GRID}' is 2^26 // hidden "
                             f"(default: {GRID},64)")
    parser.add_argument("--arch", default="sm_90",
                        help="GPU kind: sm_75 to sm_120 (default: sm_90, the H200)")
    args = parser.parse_args(argv)
    args.op_names = [op.strip() for op in args.ops.split(",") if op.strip()]
    for op in args.op_names:
        if op not in FORMS:
            parser.error(f"--ops: unknown op {op!r} (one of {', '.join(FORMS)})")
    try:
        args.hidden_sizes = [int(h) for h in args.hidden.split(",")]
        args.row_counts = [None if r.strip() == GRID else int(r) for r in args.rows.split(",")]
    except ValueError as exc:
        parser.error(f"--hidden and --rows take comma-separated integers: {exc}")
    if min(args.hidden_sizes) < 1 or any(r is not None and r < 1 for r in args.row_counts):
        parser.error("--hidden and --rows must be >= 1")
    from autonorm.dtypes import normalize_dtype
    from autonorm.export.arch import KNOWN, parse_arch

    try:
        args.dtype_names = [normalize_dtype(d) for d in args.dtypes.split(",")]
        cc = parse_arch(args.arch)
    except ValueError as exc:
        parser.error(str(exc))
    if cc not in KNOWN:
        parser.error(f"--arch: no limits known for sm_{cc} (one of "
                     f"{', '.join(f'sm_{k}' for k in KNOWN)})")
    args.limits = KNOWN[cc]
    return args


def defaults(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """Render each launch's default: the distinct kernels by name, and the shapes of each.

    Each kernel carries ``rows``, the row count of its first launch (what its leaner picks are
    ruled for).
    """
    from autonorm.errors import ConfigError
    from autonorm.ops import registry

    kernels: dict[str, Any] = {}
    shapes: dict[str, list[str]] = collections.defaultdict(list)
    for op in args.op_names:
        family = registry.get(op)
        for form, dtype, hidden in itertools.product(FORMS[op], args.dtype_names,
                                                     args.hidden_sizes):
            if form.get("residual_dtype") == dtype:
                continue  # x's own dtype: the plain add
            problem = family.problem(hidden=hidden, dtype=dtype, **form)
            for given in args.row_counts:
                rows = given or max(1, (1 << 26) // hidden)
                try:
                    config = family.default(problem, args.limits, rows)
                except ConfigError:
                    continue  # nothing runs the problem: no default to compile
                kernel = family.render(config, problem, args.limits)
                kernels.setdefault(kernel.name, (kernel, rows))
                shapes[kernel.name].append(f"{problem.describe()} x {rows} rows")
    return kernels, shapes


def leaner_runs(args: argparse.Namespace, spilling: list[Any]) -> dict[str, str | None]:
    """For each spilling (kernel, rows), the label of the pick dispatch runs in its place.

    None where no leaner pick keeps the row cache without spilling: the default then stays
    (:mod:`autonorm.fallback`).
    """
    from autonorm.fallback import leaner_offline

    picks = leaner_offline([(kernel.problem, rows, kernel.config) for kernel, rows in spilling],
                           args.limits)
    return {kernel.name: pick.label() if pick else None
            for (kernel, _), pick in zip(spilling, picks, strict=True)}


def main(argv: list[str] | None = None) -> int:
    """Compile the grid's defaults; print those that spill. Exit 1 if any does."""
    args = parse_args(argv)
    from autonorm.runtime.offline import compile_offline, nvcc_path

    if nvcc_path() is None:
        print("default_spills: nvcc is not installed", file=sys.stderr)
        return 2
    kernels, shapes = defaults(args)
    reports = compile_offline([kernel for kernel, _ in kernels.values()], args.limits.arch)
    spilling = [name for name in kernels if reports[name].spills]
    launches = sum(len(shapes[name]) for name in spilling)
    print(f"{len(spilling)} of {len(kernels)} default kernels spill ({launches} of "
          f"{sum(map(len, shapes.values()))} launches), {args.limits.arch}")
    by_hidden = collections.Counter(kernels[name][0].problem.hidden for name in spilling)
    if by_hidden:
        print("by hidden size: " + ", ".join(f"{h}: {n}" for h, n in sorted(by_hidden.items())))
    runs = leaner_runs(args, [kernels[name] for name in spilling])
    for name in spilling:
        report, kernel = reports[name], kernels[name][0]
        print(f"  {kernel.config.label()} {report.registers} registers, "
              f"{report.spill_stores} B spill stores, {report.spill_loads} B spill loads: "
              f"{shapes[name][0]}" + (f" (+{len(shapes[name]) - 1})" if len(shapes[name]) > 1
                                      else ""))
        print(f"    dispatch runs {runs[name]}" if runs[name] else
              "    no leaner pick runs without spills: dispatch keeps the default")
    return 1 if spilling else 0


if __name__ == "__main__":
    raise SystemExit(main())
