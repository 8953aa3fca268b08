"""Lab only (session 10, call C): the cluster exchange by st.async pushes, against cluster.sync.

NOTES.md 51: the fwd kernel's clustered rows pay about 2 us a row for two cluster barriers
(c2 at bf16 16384: 62% of copy against c1's 88%, at equal occupancy). The change pushes every
block's partials into every block's shared memory with st.async, counted on the receiver's
mbarrier, so a reduction costs one one-way trip and never waits on another block's stores. The
bulk kernel's one exchange per row (clusters win there at 65536 and fp32 32768-65536) gets the
same. Prediction: the fwd kernel's c2 smem kernels at 16-bit 32768 rise from 58-60% to 85% or
more of copy (single launches), and the bulk cluster winners gain 2-5 points.

Outcome (NOTES.md 52): the bulk kernel's push landed; the fwd kernel's did not (no faster), so
the working tree's fwd template is the base again and "push" fwd lines now render the base. The
fwd change measured in call C is ``tree_patches/s10_fwd_cluster_push.patch`` (on ded0de5; it
also adds ``templates/mbarrier.cuh.j2`` and ``space.scratch_bytes``).

Each config is rendered from ``--base`` (the templates before the change; make it with
``git archive HEAD templates | tar -x --strip-components=1 -C benchmarks/lab/templates_base``)
and from the working tree, verified against float64 by the product's evaluator, and timed
interleaved both ways (lab_eval.compare). Clustered smem kernels are allowed the 64-register
cap in this process (cluster_cap_lab.lift_cluster_cap_rule).
"""

from __future__ import annotations

from pathlib import Path

from cluster_cap_lab import lift_cluster_cap_rule
from lab_eval import RenderingEvaluator, lab_arguments, run_plan
from tree_render import renderer

from autonorm import codegen, compiler
from autonorm.evaluator import GpuEvaluator
from autonorm.space import H200, KernelConfig, Problem

# (dtype, hidden): [(label, trees)], trees "b" base, "n" new, "bn" both.
PLAN: dict[tuple[str, int], list[tuple[str, str]]] = {
    ("bfloat16", 32768): [("t512v8r1-bulk-two_pass-c1-p0-s2", "b"),
                          ("t512v8r1-smem-two_pass-c1-p0-m64", "b"),
                          ("t256v8r1-smem-two_pass-c2-p0-m64", "bn"),
                          ("t512v8r1-smem-two_pass-c2-p0-m64", "n"),
                          ("t256v8r1-smem-two_pass-c2-p4-m64", "n"),
                          ("t256v8r1-smem-two_pass-c2-p0", "n"),
                          ("t256v8r1-smem-two_pass-c4-p0-m64", "n"),
                          ("t512v8r1-bulk-two_pass-c2-p0-s2", "bn")],
    ("bfloat16", 16384): [("t256v8r1-smem-two_pass-c1-p0-m64", "b"),
                          ("t256v8r1-smem-two_pass-c2-p0-m64", "bn"),
                          ("t128v8r1-smem-two_pass-c2-p0-m64", "n")],
    ("bfloat16", 65536): [("t512v8r1-bulk-two_pass-c2-p0-s2", "bn"),
                          ("t512v8r1-bulk-two_pass-c4-p0-s2", "bn"),
                          ("t256v8r1-smem-two_pass-c4-p0-m64", "n"),
                          ("t512v8r1-smem-two_pass-c2-p0-m64", "n"),
                          ("t256v8r1-smem-two_pass-c8-p0-m64", "n")],
    ("float16", 65536): [("t512v8r1-bulk-two_pass-c2-p0-s2", "bn"),
                         ("t256v8r1-smem-two_pass-c4-p0-m64", "n")],
    ("float32", 32768): [("t512v4r1-bulk-two_pass-c2-p0-s2", "bn"),
                         ("t512v4r1-smem-two_pass-c2-p0", "n")],
    ("float32", 65536): [("t512v4r1-bulk-two_pass-c4-p0-s2", "bn"),
                         ("t1024v4r1-bulk-two_pass-c4-p0-s3", "bn"),
                         ("t512v4r1-smem-two_pass-c4-p0", "n")],
}


def main() -> None:
    ap = lab_arguments()
    ap.add_argument("--base", default="benchmarks/lab/templates_base")
    args = ap.parse_args()
    lift_cluster_cap_rule()
    base = Path(args.base).resolve()

    render_base = renderer(base)

    if args.offline:
        # Base and new kernels of one config share a name: compiled as two batches.
        for tree, render in (("b", render_base), ("n", codegen.render)):
            kernels = [render(KernelConfig.from_label(label), Problem(hidden, dtype), H200)
                       for (dtype, hidden), items in PLAN.items()
                       for label, trees in items if tree in trees]
            reports = compiler.compile_offline(kernels, "sm_90")
            for k in kernels:
                r = reports[k.name]
                print(tree, k.problem.dtype, k.problem.hidden, k.config.label(), r.registers,
                      r.spill_stores)
        return

    def entries_for(shape, pool):  # noqa: ANN001, ANN202 - lab_eval.EntriesFor
        (dtype, hidden), items = shape
        problem, rows = Problem(hidden, dtype), (1 << 26) // hidden
        new = GpuEvaluator(problem, rows, pool=pool)
        old = RenderingEvaluator(render_base, problem, rows, pool=pool)
        entries = []
        for label, trees in items:
            c = KernelConfig.from_label(label)
            entries += [("base", old, c)] if "b" in trees else []
            entries += [("push", new, c)] if "n" in trees else []
        return dtype, hidden, entries

    run_plan("cluster_push_lab", PLAN.items(), entries_for, args.rounds, args.out)


if __name__ == "__main__":
    main()
