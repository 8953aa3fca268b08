"""Lab only (prepared in session 10, not yet run): the fwd kernel's clusters without membar stalls.

NOTES.md 54: the fwd kernel's clustered rows stall on membar because every block runs
release-semantics cluster barriers once a row (p0: the exchanges, then the exit barrier); with
st.async pushes and a persistent grid the stalls go (bf16 16384 c2 104.5 -> 83.7 us) but c2
still trails c1 by 20%, and at 32768 the c2 block waits longer on global memory.
Two template trees (rebuilt by ``tree_patches/README.md``), rendered by the product's codegen:

- ``templates_fc``: 52's push exchange, and the prologue (mbarrier initialisation) and exit
  cluster barriers relaxed (``barrier.cluster.arrive.relaxed``, after
  ``fence.mbarrier_init``): no release barrier left in the kernel, so p0 grids lose the membar
  stalls too.
- ``templates_fc1``: fc plus one exchange per row: each block's two passes over its own segment
  with its own first element as the shift (no load from the other block's segment on the row's
  critical path), then one Chan merge of (shift, mean, M2) as in the bulk kernel.

Prediction: fc1 c2 at 16-bit 32768 and c4 at 65536 reach 88-92% of copy in single launches
(c1 at 16384 is at 92%), above the bulk winners' 86-87%; fc alone gains at p0 but stays behind.
Every kernel is verified against float64 before it is timed; the shipped winner of each shape
comes first. The cluster slots sit after the reduction scratch in these trees, so the process
adds their bytes to ``codegen.smem_bytes`` and lifts the cluster rule of the 64-register cap
(``cluster_cap_lab.lift_cluster_cap_rule``).

``--offline`` compiles the plan with nvcc (registers, spills; no GPU).
"""

from __future__ import annotations

from pathlib import Path

from cluster_cap_lab import lift_cluster_cap_rule
from lab_eval import RenderingEvaluator, lab_arguments, run_plan
from tree_render import renderer

from autonorm import codegen, compiler
from autonorm.evaluator import GpuEvaluator
from autonorm.space import H200, KernelConfig, Problem

TREES = ("fc", "fc1")
PLAN: dict[tuple[str, int], list[str]] = {
    ("bfloat16", 32768): ["t512v8r1-bulk-two_pass-c1-p0-s2", "t256v8r1-smem-two_pass-c2-p0-m64",
                          "t256v8r1-smem-two_pass-c2-p4-m64", "t512v8r1-smem-two_pass-c2-p0-m64",
                          "t512v8r1-smem-two_pass-c2-p2-m64"],
    ("float16", 32768): ["t512v8r1-bulk-two_pass-c1-p0-s3", "t256v8r1-smem-two_pass-c2-p0-m64",
                         "t256v8r1-smem-two_pass-c2-p4-m64"],
    ("bfloat16", 65536): ["t512v8r1-bulk-two_pass-c2-p0-s2", "t256v8r1-smem-two_pass-c4-p0-m64",
                          "t256v8r1-smem-two_pass-c4-p4-m64", "t512v8r1-smem-two_pass-c2-p0-m64"],
    ("bfloat16", 16384): ["t256v8r1-smem-two_pass-c1-p0-m64", "t256v8r1-smem-two_pass-c2-p0-m64",
                          "t256v8r1-smem-two_pass-c2-p4-m64"],
    ("float32", 65536): ["t512v4r1-bulk-two_pass-c4-p0-s2", "t512v4r1-smem-two_pass-c4-p0",
                         "t512v4r1-smem-two_pass-c4-p2"],
}


def add_cluster_slot_bytes() -> None:
    """Allocate the trees' cluster slots ([2][C][4] floats, two mbarriers) after the scratch."""
    shipped = codegen.smem_bytes

    def smem_bytes(config, problem):  # noqa: ANN001, ANN202 - codegen's signature
        extra = 32 * config.cluster + 16 - 32 if config.cluster > 1 and config.cache != "bulk" else 0
        return shipped(config, problem) + extra

    codegen.smem_bytes = smem_bytes


def main() -> None:
    args = lab_arguments().parse_args()
    lift_cluster_cap_rule()
    add_cluster_slot_bytes()
    lab = Path(__file__).resolve().parent

    def tree_renderer(tree: str):  # noqa: ANN202
        return renderer(lab / f"templates_{tree}")

    def plan_of(label: str) -> list[str]:
        # The shipped kind (c1, or the bulk kernel) from the product; clusters from each tree.
        c = KernelConfig.from_label(label)
        return [""] if c.cluster == 1 or c.cache == "bulk" else list(TREES)

    if args.offline:
        for tree in ("",) + TREES:
            render = tree_renderer(tree) if tree else codegen.render
            kernels = [render(KernelConfig.from_label(label), Problem(hidden, dtype), H200)
                       for (dtype, hidden), labels in PLAN.items() for label in labels
                       if tree in plan_of(label)]
            reports = compiler.compile_offline(kernels, "sm_90")
            for k in kernels:
                r = reports[k.name]
                print(tree or "product", k.problem.dtype, k.problem.hidden, k.config.label(),
                      r.registers, r.spill_stores)
        return

    def entries_for(shape, pool):  # noqa: ANN001, ANN202 - lab_eval.EntriesFor
        (dtype, hidden), labels = shape
        problem, rows = Problem(hidden, dtype), (1 << 26) // hidden
        evs = {"": GpuEvaluator(problem, rows, pool=pool)}
        evs.update({t: RenderingEvaluator(tree_renderer(t), problem, rows, pool=pool) for t in TREES})
        entries = [(tree or "prod", evs[tree], KernelConfig.from_label(label))
                   for label in labels for tree in plan_of(label)]
        return dtype, hidden, entries

    run_plan("fwd_cluster_lab", PLAN.items(), entries_for, args.rounds, args.out)


if __name__ == "__main__":
    main()
