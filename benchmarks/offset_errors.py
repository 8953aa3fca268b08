"""Worst error against float64, per dtype and verification case, of the shipped kernels.

Run on a GPU machine::

    python benchmarks/offset_errors.py
    python benchmarks/offset_errors.py --hidden 768,4096 --no-shipped

Verifies every LayerNorm winner of the shipped tuning database and the untuned default
configuration of each dtype at a list of hidden sizes, with the verifier every tuning candidate
passes (docs/accuracy.md: normal, offset and outlier-shift rows, constant rows, large and tiny
values, poisoned outputs and a guard row). Prints the failures, then the worst relative L2
error of each dtype on each case.
"""

from __future__ import annotations

import argparse

HIDDEN = (768, 1000, 1024, 2048, 4096, 8192, 12288, 16384, 32768, 65536)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line (no GPU and no autonorm import needed for ``--help``)."""
    parser = argparse.ArgumentParser(
        description="Verify the shipped LayerNorm winners and the untuned defaults against "
                    "float64 on the verifier's cases (offset rows, an outlier where the shift "
                    "is taken, constant, large and tiny rows) and print the worst relative L2 "
                    "error per dtype and case. Needs a CUDA GPU and CuPy.",
    )
    parser.add_argument("--hidden", default=",".join(map(str, HIDDEN)),
                        help="hidden sizes of the default configurations, comma-separated "
                             "(default: " + ",".join(map(str, HIDDEN)) + ")")
    parser.add_argument("--dtypes", default="fp32,fp16,bf16",
                        help="dtypes of the default configurations (default: fp32,fp16,bf16)")
    parser.add_argument("--no-shipped", action="store_true",
                        help="verify the default configurations only")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Verify every kernel; return 1 if any failed."""
    args = parse_args(argv)
    from peerbench.gpu import require_gpu

    require_gpu("offset_errors.py")
    from autonorm.dtypes import normalize_dtype
    from autonorm.ops.layer_norm.verify import verify
    from autonorm.ops.registry import get
    from autonorm.runtime import compiler
    from autonorm.runtime.device import query_device
    from autonorm.store.db import TuningDB

    family = get("layer_norm")
    limits = query_device().limits()
    kernels = []  # (problem, config)
    shipped = 0
    store = None if args.no_shipped else TuningDB.open_shipped()
    if store is not None:
        with store:
            for winner in store.winners(op=family.op):
                problem = family.problem(**winner.key.fields)
                kernels.append((problem, family.config_from_dict(winner.config)))
                shipped += 1
    for dtype in args.dtypes.split(","):
        for hidden in map(int, args.hidden.split(",")):
            problem = family.problem(hidden=hidden, dtype=normalize_dtype(dtype))
            kernels.append((problem, family.default(problem, limits)))
    worst: dict[str, dict[str, float]] = {}
    failed = []
    for problem, config in kernels:
        kernel = compiler.compile_kernel(family.render(config, problem, limits))
        result = verify(kernel, problem)
        if not result.ok:
            failed.append(f"{problem.describe()} {config.label()}: {result.summary()}")
        for case, err in result.errors.items():
            slot = worst.setdefault(problem.dtype, {})
            slot[case] = max(slot.get(case, 0.0), err.rel_l2)
    print(f"verified {len(kernels)} kernels ({shipped} shipped winners + defaults); "
          f"failures: {len(failed)}")
    for line in failed:
        print("  FAIL", line)
    for dtype, cases in worst.items():
        print(f"{dtype:9s} worst rel. L2 error: " +
              ", ".join(f"{case} {value:.2e}" for case, value in sorted(cases.items())))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
