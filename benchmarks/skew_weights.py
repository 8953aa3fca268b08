"""Skewed bulk kernels: weights joined once into shared memory against joined every row.

Run on a GPU machine::

    python benchmarks/skew_weights.py
    python benchmarks/skew_weights.py --shapes bf16:4099,fp32:4097+add --rounds 5
    python benchmarks/skew_weights.py --shapes rms:bf16:4099,rms:bf16:6151+add

Where the vector does not divide the hidden size, the bulk-copy kernel's rows start off the
vector grid, and each thread's weight and bias vectors must be joined from two aligned ones.
The plan holds them joined in shared memory for the norms in ``plan.SKEWED_WEIGHTS_IN_SMEM``
(LayerNorm), even where that costs blocks an SM; otherwise every row joins them again. This
times the untuned default configuration of each shape both ways with the tuner's evaluator
(verified against float64 first, then single launches with L2 flushed, median), the two
variants interleaved round by round, and prints the share of copy bandwidth of each and their
ratio (docs/bulk-kernel.md).
"""

from __future__ import annotations

import argparse
import statistics

# Odd hidden sizes whose untuned default at 2^26 elements is the skewed bulk kernel; "+add" is
# LayerNorm after the residual add, where the shared memory costs one or two blocks an SM.
SHAPES = ("bf16:2053", "bf16:4099", "bf16:6151", "bf16:8191", "bf16:12289", "fp16:4099",
          "fp32:2051", "fp32:4097", "fp32:6151", "bf16:4099+add", "bf16:8191+add",
          "fp16:5003+add", "fp32:2053+add", "fp32:4099+add")


OPS = {"ln": "layer_norm", "rms": "rms_norm"}


def parse_shape(text: str) -> tuple[str, str, int, bool]:
    """``[op:]dtype:hidden[+add]`` as (op, dtype, hidden, residual); op is ln (the default) or
    rms."""
    body, plus, what = text.partition("+")
    if plus and what != "add":
        raise argparse.ArgumentTypeError(f"--shapes: {text!r}: only '+add' may follow the size")
    op = "ln"
    if body.count(":") == 2:
        op, _, body = body.partition(":")
        if op not in OPS:
            raise argparse.ArgumentTypeError(f"--shapes: {text!r}: the op is ln or rms")
    dtype, colon, hidden = body.partition(":")
    if not colon or not hidden.isdigit() or int(hidden) < 1:
        raise argparse.ArgumentTypeError(f"--shapes: {text!r} is not dtype:hidden (bf16:4099)")
    return OPS[op], dtype, int(hidden), bool(plus)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line (no GPU and no autonorm import needed for ``--help``)."""
    parser = argparse.ArgumentParser(
        description="Time the skewed bulk kernel of odd hidden sizes with its weights joined "
                    "once into shared memory against joined again for every row, at each "
                    "shape's untuned default configuration and 2^26 elements, through the "
                    "tuner's evaluator. Needs a CUDA GPU and CuPy.",
    )
    parser.add_argument("--shapes", default=",".join(SHAPES),
                        help="[ln:|rms:]dtype:hidden, '+add' for the norm after the residual "
                             "add, comma-separated (default: " + ",".join(SHAPES) + ")")
    parser.add_argument("--rounds", type=int, default=3,
                        help="timings of each variant, interleaved (default 3)")
    args = parser.parse_args(argv)
    try:
        args.shapes = [parse_shape(s) for s in args.shapes.split(",") if s]
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Time every shape both ways and print the table; return 1 if a kernel failed."""
    args = parse_args(argv)
    from peerbench.gpu import require_gpu

    require_gpu("skew_weights.py")
    from autonorm.dtypes import normalize_dtype
    from autonorm.ops.layer_norm import plan as plan_module
    from autonorm.ops.registry import get
    from autonorm.runtime.compiler import CompilePool
    from autonorm.runtime.device import query_device
    from autonorm.tune.evaluator import GpuEvaluator

    limits = query_device().limits()
    chosen = plan_module.SKEWED_WEIGHTS_IN_SMEM
    failed = False
    print("| op | dtype | hidden | default | blocks an SM | joined every row | in shared memory "
          "| ratio |")
    print("|---|---|---|---|---|---|---|---|")
    pool = CompilePool()
    try:
        for op, dtype, hidden, residual in args.shapes:
            family = get(op)
            problem = family.problem(hidden=hidden, dtype=normalize_dtype(dtype),
                                     residual=residual)
            rows = 2**26 // hidden
            config = family.default(problem, limits, rows)
            blocks, shares, evaluators = {}, {}, {}
            variants = {False: chosen - {problem.norm}, True: chosen | {problem.norm}}
            for held in (False, True):
                plan_module.SKEWED_WEIGHTS_IN_SMEM = variants[held]
                plan = plan_module.derive_plan(config, problem, limits)
                blocks[held] = (plan.min_blocks, plan.weights_in_smem)
                # One evaluator a variant: each caches the kernel it rendered under the switch.
                evaluators[held] = GpuEvaluator(problem, rows, pool=pool)
                shares[held] = []
            broken = None  # the first variant that failed: the shape's rounds stop there
            for _ in range(args.rounds):
                for held in (False, True):
                    plan_module.SKEWED_WEIGHTS_IN_SMEM = variants[held]
                    outcome = evaluators[held].evaluate(config)
                    if not outcome.ok:
                        broken = outcome, held
                        break
                    shares[held].append(outcome.timing.share)
                if broken:
                    break
            evaluators.clear()
            if broken:
                outcome, held = broken
                failed = True
                print(f"{problem.describe()} {config.label()} held={held}: "
                      f"{outcome.status} {str(outcome.error)[:200]}")
                continue
            joined, held = (statistics.median(shares[v]) for v in (False, True))
            used = "" if blocks[True][1] else " (not taken)"
            name = "LN" if op == "layer_norm" else "RMS"
            name = f"add + {name}" if residual else name
            print(f"| {name} | {dtype} | {hidden} | {config.label()} "
                  f"| {blocks[False][0]} -> {blocks[True][0]}{used} | {joined:.1%} | "
                  f"{held:.1%} | x{held / joined:.3f} |", flush=True)
    finally:
        plan_module.SKEWED_WEIGHTS_IN_SMEM = chosen
        pool.close()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
