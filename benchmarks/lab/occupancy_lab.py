"""Lab only: two bulk blocks an SM for the wide rows, and weights in registers at that occupancy.

Session 15's timelines (NOTES.md 76): a clustered bulk tile costs ~1.4 us of fixed work (two row
sums with their barriers, the exchange, the refill) on top of its bytes, and with one 512-thread
block an SM nothing overlaps it, so c2 at bf16 32768 is SM-bound (waits on its tiles 3.6% of the
time, against c1's 18.5%). Two 256-thread blocks an SM would overlap one block's fixed work with
the other's passes. The search has such configs (t256 c2 at 32768, t256 c4 at 65536, 8 vectors a
thread) but its 24 trials never sampled them. And ``space.bulk_occupancy`` decides weights in
registers at its target occupancy (3 blocks by shared memory for t256 c2 s2) even when the
registers then allow only 2: such a config runs 2 blocks with weights read from L1 every row.
``fixed`` renders with the decision taken at the occupancy reached. Each shape: the shipped
winner first, then the candidates, verified and timed interleaved (``lab_eval.compare``).

    python benchmarks/lab/occupancy_lab.py --out $OUT [--offline]

Since NOTES.md 77 the product decides the weights this way, so ``changed`` is False everywhere
and the lab times only the product's kernels.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

from lab_eval import RenderingEvaluator, lab_arguments, run_plan

from autonorm import codegen, compiler, space
from autonorm.evaluator import GpuEvaluator
from autonorm.space import H200, DeviceLimits, KernelConfig, Problem

PLAN = {
    ("bfloat16", 32768): ["t512v8r1-bulk-two_pass-c1-p0-s2", "t256v8r1-bulk-two_pass-c2-p0-s2",
                          "t256v8r1-bulk-two_pass-c2-p0-s3", "t512v8r1-bulk-two_pass-c2-p0-s2"],
    ("bfloat16", 65536): ["t512v8r1-bulk-two_pass-c2-p0-s2", "t256v8r1-bulk-two_pass-c4-p0-s2",
                          "t256v8r1-bulk-two_pass-c4-p0-s3"],
    ("float32", 32768): ["t512v4r1-bulk-two_pass-c2-p0-s3", "t256v4r1-bulk-two_pass-c4-p0-s2",
                         "t256v4r1-bulk-two_pass-c4-p0-s3"],
    ("bfloat16", 16384): ["t256v8r1-smem-two_pass-c1-p0-m64", "t256v8r1-bulk-two_pass-c1-p0-s3",
                          "t256v8r1-bulk-two_pass-c1-p0-s2"],
}

# Session 16's plan (``--more``): three to five blocks an SM at finer clusters, each shape's
# shipped winner first (nvcc: none spills; blocks an SM and weights in registers in brackets).
PLAN_MORE = {
    ("bfloat16", 32768): ["t512v8r1-bulk-two_pass-c1-p0-s2", "t256v8r1-bulk-two_pass-c2-p0-s3",
                          "t128v8r1-bulk-two_pass-c4-p0-s3",  # (4, True)
                          "t128v8r1-bulk-two_pass-c4-p0-s2",  # (5, False)
                          "t256v8r1-bulk-two_pass-c4-p0-s2"],  # (3, False)
    ("float16", 32768): ["t512v8r1-bulk-two_pass-c1-p0-s2", "t256v8r1-bulk-two_pass-c2-p0-s3",
                         "t128v8r1-bulk-two_pass-c4-p0-s3"],
    ("bfloat16", 65536): ["t256v8r1-bulk-two_pass-c4-p0-s2",
                          "t128v8r1-bulk-two_pass-c8-p0-s3",  # (4, True)
                          "t128v8r1-bulk-two_pass-c8-p0-s2"],  # (5, False)
    ("float32", 65536): ["t512v4r1-bulk-two_pass-c4-p0-s3",
                         "t256v4r1-bulk-two_pass-c8-p0-s2"],  # (2, True)
    ("bfloat16", 16384): ["t256v8r1-smem-two_pass-c1-p0-m64",
                          "t128v8r1-bulk-two_pass-c2-p0-s3"],  # (4, True)
    ("float32", 16384): ["t512v4r1-bulk-two_pass-c1-p0-s2",
                         "t128v4r1-bulk-two_pass-c4-p0-s3"],  # (4, True)
}


def occupancy_at_reach(config: KernelConfig, problem: Problem,
                       device: DeviceLimits = H200) -> tuple[int, bool]:
    """``space.bulk_occupancy`` with weights in registers decided at the blocks reached."""
    blocks, wreg = space.bulk_occupancy(config, problem, device)
    if wreg or not (problem.has_weight or problem.has_bias):
        return blocks, wreg
    # Ask again at the occupancy actually reached: with target = blocks, the same rule.
    reached = limits_for_blocks(device, config, problem, blocks)
    return space.bulk_occupancy(config, problem, reached)


def limits_for_blocks(device: DeviceLimits, config: KernelConfig, problem: Problem,
                      blocks: int) -> DeviceLimits:
    """Device limits whose shared memory admits exactly ``blocks`` blocks of ``config``."""
    per_block = space.smem_bytes(config, problem) + 1024
    return dataclasses.replace(device, smem_per_sm=per_block * blocks)


@contextlib.contextmanager
def fixed_occupancy() -> Iterator[None]:
    saved = codegen.bulk_occupancy
    codegen.bulk_occupancy = occupancy_at_reach  # type: ignore[assignment]
    try:
        yield
    finally:
        codegen.bulk_occupancy = saved  # type: ignore[assignment]


def render_fixed(config: KernelConfig, problem: Problem,
                 limits: DeviceLimits) -> codegen.RenderedKernel:
    with fixed_occupancy():
        return codegen.render(config, problem, limits)


def changed(config: KernelConfig, problem: Problem) -> bool:
    """Whether ``fixed`` renders ``config`` differently (weights in registers)."""
    return occupancy_at_reach(config, problem) != space.bulk_occupancy(config, problem)


def main() -> None:
    ap = lab_arguments()
    ap.add_argument("--more", action="store_true", help="time PLAN_MORE instead of PLAN")
    args = ap.parse_args()
    plan = PLAN_MORE if args.more else PLAN
    if args.offline:
        prod, fixed = [], []  # compiled apart: a fixed kernel has its prod twin's name
        for (d, h), labels in plan.items():
            for label in labels:
                c, p = KernelConfig.from_label(label), Problem(h, d)
                prod.append(codegen.render(c, p, H200))
                if c.cache == "bulk" and changed(c, p):
                    fixed.append(render_fixed(c, p, H200))
        for tag, kernels in (("prod", prod), ("fixed", fixed)):
            reports = compiler.compile_offline(kernels)
            for k in kernels:
                r = reports[k.name]
                print(tag, k.problem.dtype, k.problem.hidden, k.config.label(), "blocks/SM",
                      k.launch.blocks_per_sm, "WREG" if "Vec wr[ITERS]" in k.source else "-",
                      "registers", r.registers, "spills", r.spill_stores)
        return

    def entries_for(shape, pool):
        (dtype, hidden), labels = shape
        problem, rows = Problem(hidden, dtype), (1 << 26) // hidden
        prod = GpuEvaluator(problem, rows, pool=pool)
        fixed = RenderingEvaluator(render_fixed, problem, rows, pool=pool)
        entries = []
        for label in labels:
            c = KernelConfig.from_label(label)
            entries.append(("prod", prod, c))
            if c.cache == "bulk" and changed(c, problem):
                entries.append(("fixed", fixed, c))
        return dtype, hidden, entries

    run_plan("occupancy_lab_more" if args.more else "occupancy_lab", plan.items(), entries_for,
             args.rounds, args.out)


if __name__ == "__main__":
    main()
