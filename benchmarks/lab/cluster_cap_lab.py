"""Lab only (prepared in session 9, not yet run): clustered smem kernels under the 64-register cap.

Session 9's call B (NOTES.md 46) timed the fwd kernel's clusters uncapped: 25-38% of copy,
because the cluster exchange pushes them to 55-117 registers, so one 512-thread block fits an SM.
``space`` forbids ``max_regs`` with a cluster ("a cluster's exchange spills under the cap"), yet
the sweep behind that rule found no spill in 838 clustered smem kernels (NOTES.md 33), and nvcc
13.0 fits every config below in 64 registers without spills. A cluster of 2 at 32768 gives each
block the 16384 winner's segment (t256v8r1-smem-m64, 93% of copy in the peers' run) plus one
cluster barrier per reduction.

Prediction: capped clustered smem kernels run at 4 blocks of 256 per SM like the 16384 winner;
16-bit 32768 with a cluster of 2 and 65536 with a cluster of 4 reach about the 16384 winner's
share less the cluster barriers (85-90% in the tuner's timing), above the bulk winners (82-84%).

This process lifts the rule for smem caches only (``space._max_regs_reasons`` patched), verifies
every kernel against float64 with the product's evaluator and times them interleaved with the
shipped winner (the first line of each shape).

Run from the repo root on the GPU machine: ``python benchmarks/lab/cluster_cap_lab.py --out $OUT``;
``--offline`` compiles the plan with nvcc instead (registers and spills, no GPU).
"""

from __future__ import annotations

from lab_eval import lab_arguments, run_plan

from autonorm import codegen, compiler, space
from autonorm.evaluator import GpuEvaluator
from autonorm.space import H200, KernelConfig, Problem

PLAN: dict[tuple[str, int], list[str]] = {
    ("bfloat16", 32768): ["t512v8r1-bulk-two_pass-c1-p0-s2", "t512v8r1-smem-two_pass-c1-p0-m64",
                          "t256v8r1-smem-two_pass-c2-p0-m64",
                          "t512v8r1-smem-two_pass-c2-p0-m64", "t256v8r1-smem-two_pass-c4-p0-m64",
                          "t256v8r1-smem-two_pass-c2-p0"],
    ("float16", 32768): ["t512v8r1-bulk-two_pass-c1-p0-s2", "t256v8r1-smem-two_pass-c2-p0-m64",
                         "t512v8r1-smem-two_pass-c2-p0-m64"],
    ("bfloat16", 65536): ["t512v8r1-bulk-two_pass-c2-p0-s2", "t256v8r1-smem-two_pass-c4-p0-m64",
                          "t512v8r1-smem-two_pass-c4-p0-m64", "t256v8r1-smem-two_pass-c8-p0-m64",
                          "t512v8r1-smem-two_pass-c2-p0-m64"],
    ("float16", 65536): ["t512v8r1-bulk-two_pass-c2-p0-s2", "t256v8r1-smem-two_pass-c4-p0-m64",
                         "t512v8r1-smem-two_pass-c4-p0-m64"],
    ("bfloat16", 16384): ["t256v8r1-smem-two_pass-c1-p0-m64", "t256v8r1-smem-two_pass-c2-p0-m64",
                          "t128v8r1-smem-two_pass-c2-p0-m64"],
}

# Call B (session 10): call A's capped clusters were one cluster per row (p0) and ran at 49-59%
# of copy, with the same time per row and block as the c1 winner; so fewer blocks were in
# flight. Prediction: a persistent grid of clusters (p2/p4, all resident) keeps 4 blocks of 256
# per SM busy and recovers most of the gap; if it does not, the cluster barriers are the cost.
PERSISTENT_PLAN: dict[tuple[str, int], list[str]] = {
    ("bfloat16", 32768): ["t512v8r1-bulk-two_pass-c1-p0-s2", "t256v8r1-smem-two_pass-c2-p0-m64",
                          "t256v8r1-smem-two_pass-c2-p2-m64", "t256v8r1-smem-two_pass-c2-p4-m64",
                          "t512v8r1-smem-two_pass-c2-p2-m64", "t256v8r1-smem-two_pass-c4-p2-m64",
                          "t256v8r1-smem-two_pass-c4-p4-m64"],
    ("bfloat16", 16384): ["t256v8r1-smem-two_pass-c1-p0-m64", "t256v8r1-smem-two_pass-c1-p4-m64",
                          "t256v8r1-smem-two_pass-c2-p4-m64", "t128v8r1-smem-two_pass-c2-p8-m64"],
    ("bfloat16", 65536): ["t512v8r1-bulk-two_pass-c2-p0-s2", "t256v8r1-smem-two_pass-c4-p2-m64",
                          "t256v8r1-smem-two_pass-c4-p4-m64", "t512v8r1-smem-two_pass-c4-p1-m64",
                          "t256v8r1-smem-two_pass-c8-p4-m64"],
}

_shipped_rule = space._max_regs_reasons  # noqa: SLF001


def lift_cluster_cap_rule() -> None:
    """Allow ``max_regs`` on clustered smem kernels in this process only."""

    def reasons(config, problem, shape, device):  # noqa: ANN001, ANN202 - the patched signature
        found = _shipped_rule(config, problem, shape, device)
        if config.cluster > 1 and config.cache == "smem":
            found = [r for r in found if "cluster 1 only" not in r]
        return found

    space._max_regs_reasons = reasons  # noqa: SLF001


def offline(plan: dict[tuple[str, int], list[str]]) -> None:
    kernels = [codegen.render(KernelConfig.from_label(label), Problem(hidden, dtype), H200)
               for (dtype, hidden), labels in plan.items() for label in labels]
    reports = compiler.compile_offline(kernels, "sm_90")
    for k in kernels:
        r = reports[k.name]
        print(k.problem.dtype, k.problem.hidden, k.config.label(), r.registers, r.spill_stores)


def shape_entries(shape: tuple[tuple[str, int], list[str]],
                  pool: compiler.CompilePool) -> tuple[str, int, list]:
    """One shape's entries: every planned config on one evaluator, named by its cluster."""
    (dtype, hidden), labels = shape
    ev = GpuEvaluator(Problem(hidden, dtype), (1 << 26) // hidden, pool=pool)
    return dtype, hidden, [(f"c{c.cluster}", ev, c) for c in map(KernelConfig.from_label, labels)]


def main() -> None:
    ap = lab_arguments()
    ap.add_argument("--persistent", action="store_true", help="call B's plan (persistent grids)")
    args = ap.parse_args()
    lift_cluster_cap_rule()
    plan, name = (PERSISTENT_PLAN, "cluster_persist_lab") if args.persistent else (PLAN, "cluster_cap_lab")
    if args.offline:
        offline(plan)
        return
    run_plan(name, plan.items(), shape_entries, args.rounds, args.out)


if __name__ == "__main__":
    main()
