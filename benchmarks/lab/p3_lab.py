"""Lab only: the normalize pass's weight/bias loads, issued earlier or unrolled differently.

Session 9's call A/B (decompose_lab.py) found the 16-bit smem winners x1.03-1.04 faster at
12288-16384 (and t512 at 32768 x1.07) without weight and bias, and call C (rt_lab.py) that sharing
one load among several rows does not recover it. So is it the loads' latency in pass 3? The tree
``templates_p3`` takes two template globals: ``U3_LAB``, the unroll of pass 3 (4 as shipped; 0
unrolls fully), and ``PRE_LAB``, which loads the weight and bias of the first (up to 4) vectors
into registers before pass 3: 1 just before the pass-2 reduction (their latency hides behind
its barrier), 2 right after the row cache fill is issued (behind the fill's DRAM latency). The
``noaff`` line is the same config on a problem without weight and bias (the ceiling). Each kernel
is verified against float64 by the product's evaluator, then all are timed interleaved.

Build the tree(s) first (templates_p3): ``benchmarks/lab/tree_patches/README.md``.
Run from the repo root on the GPU machine: ``python benchmarks/lab/p3_lab.py --out $OUT``;
``--offline`` compiles the plan with nvcc instead (registers and spills, no GPU).
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

from lab_eval import RenderingEvaluator, lab_arguments, run_plan
from tree_render import templates_from

from autonorm import codegen, compiler
from autonorm.space import H200, DeviceLimits, KernelConfig, Problem

TREE = Path(__file__).parent / "templates_p3"
W16 = "t256v8r1-smem-two_pass-c1-p0-m64"
VARIANTS = ("base", "noaff", "u2", "u8", "pre1", "pre2")
GLOBALS = {"u2": {"U3_LAB": 2}, "u8": {"U3_LAB": 0}, "pre1": {"PRE_LAB": 1},
           "pre2": {"PRE_LAB": 2}}
PLAN = (
    ("bfloat16", 16384, W16), ("float16", 16384, W16), ("bfloat16", 12288, W16),
    ("float16", 12288, W16), ("bfloat16", 8192, W16),
    ("bfloat16", 32768, "t512v8r1-smem-two_pass-c1-p0-m64"),
    ("bfloat16", 4096, "t128v8r1-smem-two_pass-c1-p0-m64"),
)


def render_variant(config: KernelConfig, problem: Problem, limits: DeviceLimits = H200,
                   *, variant: str) -> codegen.RenderedKernel:
    """``config`` as shipped (base, noaff) or from ``templates_p3`` with the variant's globals."""
    if variant not in GLOBALS:
        return codegen.render(config, problem, limits)
    with templates_from(TREE):
        codegen.template_environment().globals.update(GLOBALS[variant])
        rendered = codegen.render(config, problem, limits)
    name = f"{rendered.name}_{variant}"
    return dataclasses.replace(rendered, name=name,
                               source=rendered.source.replace(rendered.name, name))


def offline() -> None:
    for dtype, hidden, label in PLAN:
        problem = Problem(hidden, dtype)
        kernels = [render_variant(KernelConfig.from_label(label), problem, variant=v)
                   for v in VARIANTS if v != "noaff"]
        reports = compiler.compile_offline(kernels, "sm_90")
        for k in kernels:
            r = reports[k.name]
            print(dtype, hidden, label, k.name.rsplit("_", 1)[-1], r.registers, r.spill_stores)


def shape_entries(shape: tuple[str, int, str], pool: compiler.CompilePool) -> tuple[str, int, list]:
    """One shape's entries: the config under every variant, each with its own evaluator."""
    dtype, hidden, label = shape
    config = KernelConfig.from_label(label)
    entries = []
    for v in VARIANTS:
        problem = Problem(hidden, dtype, has_weight=v != "noaff", has_bias=v != "noaff")
        render = functools.partial(render_variant, variant=v)
        entries.append((v, RenderingEvaluator(render, problem, (1 << 26) // hidden, pool=pool),
                        config))
    return dtype, hidden, entries


def main() -> None:
    args = lab_arguments().parse_args()
    if args.offline:
        offline()
        return
    run_plan("p3_lab", PLAN, shape_entries, args.rounds, args.out)


if __name__ == "__main__":
    main()
