"""Few-row latency of chosen configurations, forced through autonorm.torch, beside torch.compile.

Run on a GPU machine::

    python benchmarks/forced.py --dtypes fp32 --hidden 490,1072 --rows 1,64,256
    python benchmarks/forced.py --hidden 27656 --rows 1,8 \
        --configs t256v4r1-registers-two_pass-c8-p0
    python benchmarks/forced.py --dtypes fp32 --hidden 490 --plan    # the candidates, no GPU

Where ``explore.py`` times kernels alone with the tuner's evaluator, this times what a PyTorch
user's call costs: ``autonorm.torch.layer_norm`` (or ``rms_norm``) replayed from a CUDA graph
(``peerbench.timing.graph_ms``), with dispatch made to hand out each configuration in turn,
beside dispatch's own pick (no database: ``AUTONORM_NO_SHIPPED_DB=1`` and an empty user
database) and torch.compile of the PyTorch function, in one process. Every configuration is
checked against float64 first, on normal rows and, in fp32, on rows of mean 1000 and spread
0.1. The candidates are the labels of ``--configs`` or, without it, every valid configuration
of the row kernel's register cache with one row a block (``--threads``, every vector width,
two-pass and Welford, with and without the early weight loads). Each is timed ``--rounds``
times, in forward then reverse order, and the median is kept. docs/kernels.md (few rows).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # benchmarks/ is not a package: peerbench is imported from here

from peerbench.labels import parse_labels  # noqa: E402
from peerbench.untuned_constants import EPS, OFFSET_MEAN, OFFSET_SPREAD  # noqa: E402

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line (no GPU and no autonorm import needed for ``--help``)."""
    parser = argparse.ArgumentParser(
        description="Time chosen LayerNorm or RMSNorm configurations through autonorm.torch by "
                    "CUDA-graph replay at a few rows, beside dispatch's default and "
                    "torch.compile, in one process. Needs a CUDA GPU (--plan does not).",
    )
    parser.add_argument("--op", choices=("layer_norm", "rms_norm"), default="layer_norm",
                        help="the norm (default: layer_norm)")
    parser.add_argument("--dtypes", default="fp32", help="bf16, fp16, fp32 (default: fp32)")
    parser.add_argument("--hidden", required=True, help="hidden sizes, comma-separated")
    parser.add_argument("--rows", default="1,64,256", help="row counts (default: 1,64,256)")
    parser.add_argument("--configs", default="",
                        help="configuration labels, comma-separated (default: the register "
                             "cache's valid configurations)")
    parser.add_argument("--threads", default="32,64,128,256,512",
                        help="block sizes of the default candidates (default: 32-512)")
    parser.add_argument("--rounds", type=int, default=2, help="timings of each (default: 2)")
    parser.add_argument("--top", type=int, default=6, help="configurations printed a shape")
    parser.add_argument("--json", default="", help="write every number here")
    parser.add_argument("--plan", action="store_true",
                        help="print the candidates of each shape and exit (no GPU needed)")
    args = parser.parse_args(argv)
    try:
        args.dtypes = [DTYPES[d.strip()] for d in args.dtypes.split(",") if d.strip()]
        args.hidden = [int(h) for h in args.hidden.split(",") if h.strip()]
        args.rows = [int(r) for r in args.rows.split(",") if r.strip()]
        args.threads = [int(t) for t in args.threads.split(",") if t.strip()]
    except (KeyError, ValueError) as exc:
        parser.error(f"--dtypes, --hidden, --rows and --threads take comma-separated values "
                     f"({exc})")
    if not args.hidden or min(args.hidden) < 1 or not args.rows or min(args.rows) < 1:
        parser.error("--hidden and --rows need positive integers")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


def problem_of(op: str, hidden: int, dtype: str):  # noqa: ANN201 - a family's problem
    """The family problem ``autonorm.torch`` dispatches for a weight (and a LayerNorm bias)."""
    if op == "rms_norm":
        from autonorm.ops.rms_norm.problem import Problem
    else:
        from autonorm.ops.layer_norm.problem import Problem
    return Problem(hidden=hidden, dtype=dtype)


def candidates(problem, args: argparse.Namespace, limits) -> list:  # noqa: ANN001
    """The configurations to time for ``problem``: ``--configs``, or the register cache's."""
    from autonorm.ops.registry import family_of

    family = family_of(problem)
    if args.configs:
        try:
            configs = parse_labels(family.config_type, args.configs)
        except ValueError as exc:
            raise SystemExit(f"forced.py: error: --configs: {exc}") from None
    else:
        configs = [
            family.config_type(threads, vec, 1, "registers", stats, 1, 0, early=early)
            for threads, vec, stats, early in itertools.product(
                args.threads, (1, 2, 4, 8), ("two_pass", "welford"), (False, True))
        ]
    return [c for c in configs if not family.check(c, problem, limits)]


def plan(args: argparse.Namespace) -> int:
    """Print each shape's candidates as the device limits of an H200 admit them."""
    from autonorm.runtime.limits import H200

    for dtype, hidden in itertools.product(args.dtypes, args.hidden):
        configs = candidates(problem_of(args.op, hidden, dtype), args, H200)
        print(f"{args.op} {dtype} {hidden}: {len(configs)} candidates, rows {args.rows}")
        for config in configs:
            print(f"  {config.label()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Measure and print each shape's default, torch.compile and fastest candidates."""
    args = parse_args(argv)
    if args.plan:
        return plan(args)
    from peerbench.gpu import require_gpu

    require_gpu("forced.py", torch=True)
    os.environ["AUTONORM_NO_SHIPPED_DB"] = "1"
    os.environ.setdefault("AUTONORM_DB", str(Path(os.environ.get("TMPDIR", "/tmp"))
                                            / f"autonorm-forced-{os.getpid()}.db"))
    import torch
    import torch.nn.functional as F  # noqa: N812
    from peerbench.checks import rel_error
    from peerbench.timing import graph_ms

    import autonorm.torch as ant
    from autonorm import dispatch
    from autonorm.lookup import Choice
    from autonorm.numerics import TOLERANCES
    from autonorm.ops.registry import family_of
    from autonorm.runtime.compiler import CompilePool
    from autonorm.runtime.device import query_device
    from autonorm.torch.forward import clear_kernel_cache

    info = query_device()
    limits = info.limits()
    own_choice = dispatch.choose_config
    forced: dict[str, object] = {}

    def choose(problem, rows, device_id=0):  # noqa: ANN001, ANN202
        config = forced.get("config")
        return Choice(config, "default") if config is not None else own_choice(
            problem, rows, device_id)

    dispatch.choose_config = choose  # every miss below asks here first
    if args.op == "rms_norm":
        def ours(x, w, b):  # noqa: ANN001, ANN202, ARG001
            return ant.rms_norm(x, w, EPS)

        def theirs(x, w, b):  # noqa: ANN001, ANN202, ARG001
            return F.rms_norm(x, (x.shape[-1],), w, EPS)
    else:
        def ours(x, w, b):  # noqa: ANN001, ANN202
            return ant.layer_norm(x, w, b, EPS)

        def theirs(x, w, b):  # noqa: ANN001, ANN202
            return F.layer_norm(x, (x.shape[-1],), w, b, EPS)
    compiled = torch.compile(theirs, dynamic=False)
    pool = CompilePool()
    records = []

    def use(config) -> None:  # noqa: ANN001
        forced["config"] = config
        dispatch.clear_cache()
        clear_kernel_cache()

    def poisoned(xin):  # noqa: ANN001, ANN202
        # The output's block comes back from the caching allocator: fill it with NaN first, so
        # a kernel that writes nothing shows, not the last kernel's output.
        poison = torch.full_like(xin, float("nan"))
        del poison
        return ours(xin, w, b)

    for dtype, hidden in itertools.product(args.dtypes, args.hidden):
        # Dynamo's entries count per code object across shapes (dynamic=False compiles each
        # row count): past recompile_limit it would time the eager function as torch.compile.
        torch._dynamo.reset()
        problem = problem_of(args.op, hidden, dtype)
        family = family_of(problem)
        configs = candidates(problem, args, limits)
        rendered = [family.render(c, problem, limits) for c in configs]
        for r in rendered:
            pool.submit(r, info.arch)  # compile them all at once; the timing loop then hits
        for r in rendered:
            pool.wait(r)
        tdtype = getattr(torch, dtype)
        w = (1 + 0.1 * torch.randn(hidden, device="cuda")).to(tdtype)
        b = (0.1 * torch.randn(hidden, device="cuda")).to(tdtype)
        for rows in args.rows:
            x = torch.randn(rows, hidden, device="cuda", dtype=tdtype)
            ref = theirs(x.double(), w.double(), b.double())
            xo = (OFFSET_MEAN + OFFSET_SPREAD * torch.randn(rows, hidden, device="cuda")).to(tdtype)
            refo = theirs(xo.double(), w.double(), b.double())
            rec = {"op": args.op, "dtype": dtype, "hidden": hidden, "rows": rows,
                   "device": info.name, "configs": {}}
            use(None)
            ours(x, w, b)
            rec["default"] = dispatch.chosen(problem, rows).config.label()
            compiled(x, w, b)
            times: dict[str, list[float]] = {"default": [], "compile": []}
            order = list(configs)
            failed: set[str] = set()
            for round_ in range(args.rounds):
                use(None)
                ours(x, w, b)
                times["default"].append(graph_ms(functools.partial(ours, x, w, b))[0] * 1e3)
                times["compile"].append(graph_ms(functools.partial(compiled, x, w, b))[0] * 1e3)
                for config in order:
                    label = config.label()
                    use(config)
                    if round_ == 0:
                        err = rel_error(poisoned(x), ref, ref.norm())
                        off = (rel_error(poisoned(xo), refo, refo.norm())
                               if dtype == "float32" else None)
                        rec["configs"][label] = {"err": err, "offset_err": off}
                        # not <=: a NaN (an unwritten, poisoned output) fails as well
                        tol = TOLERANCES[dtype]["rel_l2"]
                        if not (err <= tol and (off is None or off <= tol)):
                            failed.add(label)
                            print(f"  FAILED {label}: error {err:.1e}"
                                  + ("" if off is None else f", offset rows {off:.1e}"))
                    if label not in failed:
                        ours(x, w, b)  # load the kernel before the graph's capture
                        times.setdefault(label, []).append(
                            graph_ms(functools.partial(ours, x, w, b))[0] * 1e3)
                order.reverse()
            use(None)
            median = {k: statistics.median(v) for k, v in times.items()}
            for label, entry in rec["configs"].items():
                entry["us"] = median.get(label, float("inf"))  # inf: failed the check
            rec["default_us"], rec["compile_us"] = median["default"], median["compile"]
            records.append(rec)
            print(f"{args.op} {dtype} {hidden} rows {rows}: torch.compile "
                  f"{rec['compile_us']:.3f} us, default {rec['default']} {rec['default_us']:.3f}"
                  f" us (x{rec['compile_us'] / rec['default_us']:.2f})", flush=True)
            ranked = sorted(rec["configs"].items(), key=lambda kv: kv[1]["us"])
            for label, entry in [kv for kv in ranked if kv[0] not in failed][:args.top]:
                off = "" if entry["offset_err"] is None else f" offset {entry['offset_err']:.1e}"
                print(f"  {entry['us']:.3f} us x{rec['compile_us'] / entry['us']:.2f}  "
                      f"err {entry['err']:.1e}{off}  {label}", flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps(records, indent=1))
    pool.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
