"""Host cost of one kernel launch: autonorm's direct driver path against CuPy's Function call.

Run on a GPU machine::

    python benchmarks/launch_overhead.py
    python benchmarks/launch_overhead.py --hidden 4096 --dtype fp32 --launches 20000

A kernel's launch goes straight to ``cuLaunchKernel`` through ctypes, its parameters packed by
one ``struct.pack_into`` (``autonorm/runtime/driver.py``); CuPy's ``Function`` call is the
fallback. This script compiles the untuned default kernel for one shape at one row (where the
host's cost, not the kernel's, is what a call takes), launches it back to back without a sync
in the timed window, and prints the host time per launch of each path and of a whole
``autonorm.layer_norm`` call on CuPy arrays (whose kernel is dispatch's pick for the shape).
docs/timing.md explains the figures.
"""

from __future__ import annotations

import argparse
import time


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line (no GPU and no autonorm import needed for ``--help``)."""
    parser = argparse.ArgumentParser(
        description="Host time per launch of one LayerNorm kernel: the direct driver path "
                    "(ctypes cuLaunchKernel) against CuPy's Function call, and a whole "
                    "autonorm.layer_norm call. Needs a CUDA GPU and CuPy.",
    )
    parser.add_argument("--hidden", type=int, default=16384, help="hidden size (default: 16384)")
    parser.add_argument("--dtype", default="bf16", help="bf16, fp16 or fp32 (default: bf16)")
    parser.add_argument("--rows", type=int, default=1, help="rows per launch (default: 1)")
    parser.add_argument("--launches", type=int, default=5000,
                        help="timed launches per path (default: 5000)")
    return parser.parse_args(argv)


def per_launch_us(call, launches: int) -> float:  # noqa: ANN001
    """Host microseconds per call of ``call`` over ``launches`` back-to-back calls."""
    import cupy

    for _ in range(200):
        call()
    cupy.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(launches):
        call()
    t1 = time.perf_counter()
    cupy.cuda.Device().synchronize()
    return (t1 - t0) / launches * 1e6


def main(argv: list[str] | None = None) -> int:
    """Measure and print the host cost of each launch path."""
    args = parse_args(argv)
    from peerbench.gpu import require_gpu

    require_gpu("launch_overhead.py")
    import cupy

    import autonorm
    from autonorm.dtypes import normalize_dtype
    from autonorm.ops.registry import get
    from autonorm.runtime import compiler
    from autonorm.runtime.device import query_device

    family = get("layer_norm")
    dtype = normalize_dtype(args.dtype)
    problem = family.problem(hidden=args.hidden, dtype=dtype)
    limits = query_device().limits()
    config = family.default(problem, limits)
    kernel = compiler.compile_kernel(family.render(config, problem, limits))
    if dtype == "bfloat16":
        from ml_dtypes import bfloat16 as element  # CuPy arrays of bf16 take ml_dtypes' type
    else:
        element = {"float32": cupy.float32, "float16": cupy.float16}[dtype]
    x = cupy.ones((args.rows, args.hidden), dtype=cupy.float32).astype(element)
    y = cupy.empty_like(x)
    w = cupy.ones(args.hidden, dtype=cupy.float32).astype(element)
    b = cupy.zeros(args.hidden, dtype=cupy.float32).astype(element)
    stream = cupy.cuda.get_current_stream().ptr
    values = (x.data.ptr, w.data.ptr, b.data.ptr, y.data.ptr, args.rows, 1e-5)
    print(f"{problem.describe()}, {args.rows} rows, {config.label()}")
    driver = kernel._driver is not None  # noqa: SLF001 - which path launch() takes
    if driver:
        us = per_launch_us(lambda: kernel.launch(values, stream), args.launches)
        print(f"  driver path (ctypes cuLaunchKernel): {us:6.2f} us per launch")
    else:
        print("  driver path: not available here (CuPy's path is used)")
    # The whole call (its kernel is dispatch's pick for the shape), before the driver is off.
    us = per_launch_us(lambda: autonorm.layer_norm(x, w, b, 1e-5), args.launches)
    print(f"  autonorm.layer_norm (whole call):    {us:6.2f} us per call")
    kernel._driver = None  # noqa: SLF001 - force CuPy's Function call from here on
    us = per_launch_us(lambda: kernel.launch(values, stream), args.launches)
    print(f"  CuPy Function call:                  {us:6.2f} us per launch")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
