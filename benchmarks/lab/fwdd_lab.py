"""Lab only: the fwd kernel's persistent grid with rows claimed dynamically (``templates_fwdd``).

``timeline_lab.py`` (session 11, call B) put the fwd winner at bf16 16384 (one block a row, p0)
at 480 of its 528 block slots busy on average, and ended over ~6 us; the persistent grid of the
same kernel (p4, static stride) ran 87.7% against p0's 92.7% (NOTES 51). In ``templates_fwdd``
a persistent smem two-pass kernel (one row a block, cluster 1) takes its first row statically
and claims every later one with an atomic on a module-global counter (claimed at the top of an
iteration, published in shared memory before pass 1's barrier), as the bulk kernel's dynamic
schedule does (NOTES 57). Lab only: the counter is shared by every launch of the module.

Prediction: the dynamic p4 kernel at least matches p0 at 16-bit 8192-16384 (no block launch
turnover, same occupancy) and beats static p4 by 4-5 points; a gain over p0 of 1-2 points at
most, since the tail (the last rows' ~9 us) stays.
"""

from __future__ import annotations

from pathlib import Path

from lab_eval import RenderingEvaluator, lab_arguments, run_plan
from tree_render import templates_from

from autonorm import codegen, compiler
from autonorm.evaluator import GpuEvaluator
from autonorm.space import H200, KernelConfig, Problem

TREE = Path(__file__).resolve().parent / "templates_fwdd"
W256 = "t256v8r1-smem-two_pass-c1-p{}-m64"
PLAN: dict[tuple[str, int], list[tuple[str, str]]] = {
    ("bfloat16", 16384): [("prod", W256.format(0)), ("prod", W256.format(4)),
                          ("fwdd", W256.format(4)), ("fwdd", W256.format(2)),
                          ("fwdd", W256.format(0))],
    ("float16", 16384): [("prod", W256.format(0)), ("fwdd", W256.format(4))],
    ("bfloat16", 12288): [("prod", W256.format(0)), ("prod", W256.format(4)),
                          ("fwdd", W256.format(4))],
    ("float16", 12288): [("prod", W256.format(0)), ("fwdd", W256.format(4))],
    ("bfloat16", 8192): [("prod", W256.format(0)), ("fwdd", W256.format(4))],
    ("bfloat16", 32768): [("prod", "t512v8r1-bulk-two_pass-c1-p0-s3"),
                          ("prod", "t512v8r1-smem-two_pass-c1-p0-m64"),
                          ("fwdd", "t512v8r1-smem-two_pass-c1-p2-m64")],
}


def render_fwdd(config, problem, limits):  # noqa: ANN001, ANN201 - lab_eval.Render
    with templates_from(TREE):
        return codegen.render(config, problem, limits)


def main() -> None:
    args = lab_arguments().parse_args()
    if args.offline:
        kernels = [render_fwdd(KernelConfig.from_label(label), Problem(h, d), H200)
                   for (d, h), entries in PLAN.items() for tree, label in entries if tree == "fwdd"]
        reports = compiler.compile_offline(kernels, "sm_90")
        for k in kernels:
            r = reports[k.name]
            dyn = "fd_ctr" in k.source
            print(k.problem.dtype, k.problem.hidden, k.config.label(), r.registers,
                  r.spill_stores, "dynamic" if dyn else "STATIC")
        return

    def entries_for(shape, pool):  # noqa: ANN001, ANN202 - lab_eval.EntriesFor
        (dtype, hidden), plan = shape
        problem, rows = Problem(hidden, dtype), (1 << 26) // hidden
        evs = {"prod": GpuEvaluator(problem, rows, pool=pool),
               "fwdd": RenderingEvaluator(render_fwdd, problem, rows, pool=pool)}
        return dtype, hidden, [(t, evs[t], KernelConfig.from_label(label)) for t, label in plan]

    run_plan("fwdd_lab", PLAN.items(), entries_for, args.rounds, args.out)


if __name__ == "__main__":
    main()
