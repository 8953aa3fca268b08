"""Which valid configurations of the working tree ptxas spills (nvcc, no GPU; session 25).

    python benchmarks/lab/register_cache_sweep.py --min-estimate 70          # sweep 1
    python benchmarks/lab/register_cache_sweep.py --fp32-narrow --both       # sweep 2
    python benchmarks/lab/register_cache_sweep.py --min-estimate 70 --keep-x-only \
        --others 500                                                          # sweep 3

Sweep 1: every register row cache whose estimate is at least ``--min-estimate``, over 8 hidden
sizes and the 3 dtypes, keep_x off. Sweep 2: the fp32 register caches at vec 1-2 with 10 or more
vectors a thread over 11 sizes, both keep_x forms. Sweep 3: sweep 1 with keep_x on, plus
``--others`` sampled shared-memory and uncached kernels. One kernel per distinct code (the
offline test's ``code_label``); prints the spilled ones (NOTES.md 122).
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

from autonorm import codegen, compiler
from autonorm.space import (
    DTYPES,
    KernelConfig,
    Problem,
    derive_shape,
    enumerate_space,
    min_blocks_per_sm,
    register_estimate,
)

sys.path.insert(0, str(Path(__file__).parents[2] / "tests"))
from test_compile_offline import code_label  # noqa: E402

SIZES = (768, 1000, 1024, 2048, 4096, 8192, 16384, 65536)
NARROW_SIZES = SIZES + (1536, 3072, 6144)


def pick(args: argparse.Namespace) -> list[tuple[KernelConfig, Problem]]:
    """The configurations the arguments name, one per distinct code."""
    chosen: dict[tuple, tuple[KernelConfig, Problem]] = {}
    others: dict[tuple, tuple[KernelConfig, Problem]] = {}
    dtypes = ("float32",) if args.fp32_narrow else DTYPES
    for dtype in dtypes:
        for hidden in NARROW_SIZES if args.fp32_narrow else SIZES:
            problem = Problem(hidden, dtype)
            for c in enumerate_space(problem):
                if args.keep_x_only and not c.keep_x or not (args.both or args.keep_x_only) \
                        and c.keep_x:
                    continue
                key = (dtype, hidden, code_label(c))
                if c.cache == "registers":
                    if args.fp32_narrow and (c.vec > 2 or derive_shape(c, problem).iters < 10):
                        continue
                    if register_estimate(c, problem) >= args.min_estimate:
                        chosen.setdefault(key, (c, problem))
                elif c.cache != "bulk" and args.others:
                    others.setdefault(key, (c, problem))
    rng = random.Random(5)
    sample = rng.sample(sorted(others), min(args.others, len(others)))
    return list(chosen.values()) + [others[k] for k in sample]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--min-estimate", type=int, default=0)
    ap.add_argument("--fp32-narrow", action="store_true")
    ap.add_argument("--both", action="store_true", help="keep_x off and on")
    ap.add_argument("--keep-x-only", action="store_true")
    ap.add_argument("--others", type=int, default=0)
    args = ap.parse_args()
    configs = pick(args)
    print(len(configs), "kernels", flush=True)
    kernels = [codegen.render(c, p) for c, p in configs]
    spilled = 0
    for i in range(0, len(kernels), 150):
        batch = kernels[i:i + 150]
        reports = compiler.compile_offline(batch, "sm_90")
        for k in batch:
            r = reports[k.name]
            if r.spills:
                spilled += 1
                print("SPILL", k.problem.dtype, k.problem.hidden, k.config.label(), r.registers,
                      "regs", r.spill_stores, "B; estimate", register_estimate(k.config, k.problem),
                      "min blocks", min_blocks_per_sm(k.config, k.problem), flush=True)
    print(spilled, "spilled of", len(kernels))


if __name__ == "__main__":
    main()
