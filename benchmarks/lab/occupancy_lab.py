"""Lab only: more bulk blocks an SM for the wide rows, timed against the shipped winners.

Session 15's timelines (NOTES.md 76): a clustered bulk tile costs ~1.4 us of fixed work (two row
sums with their barriers, the exchange, the refill) on top of its bytes, and with one 512-thread
block an SM nothing overlaps it, so c2 at bf16 32768 is SM-bound (waits on its tiles 3.6% of the
time, against c1's 18.5%). Two or more blocks an SM overlap one block's fixed work with another's
passes. Each shape: the shipped winner first, then the candidates, verified and timed
interleaved (``lab_eval.compare``); ``--offline`` compiles them with nvcc instead (blocks an SM,
weights in registers, registers, spills; no GPU).

    python benchmarks/lab/occupancy_lab.py --out $OUT [--more] [--offline]

Call s15g ran PLAN with a second rendering of each config whose weights the old
``space.bulk_occupancy`` left in L1 ("fixed": weights decided at the blocks reached; that code
is in commit ac4ced7). NOTES.md 77 made that rule the product's, so the lab times only the
product's kernels now.
"""

from __future__ import annotations

from lab_eval import lab_arguments, run_plan

from autonorm import codegen, compiler
from autonorm.evaluator import GpuEvaluator
from autonorm.space import H200, KernelConfig, Problem

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


def main() -> None:
    ap = lab_arguments()
    ap.add_argument("--more", action="store_true", help="time PLAN_MORE instead of PLAN")
    args = ap.parse_args()
    plan = PLAN_MORE if args.more else PLAN
    if args.offline:
        kernels = [codegen.render(KernelConfig.from_label(label), Problem(h, d), H200)
                   for (d, h), labels in plan.items() for label in labels]
        reports = compiler.compile_offline(kernels)
        for k in kernels:
            r = reports[k.name]
            print(k.problem.dtype, k.problem.hidden, k.config.label(), "blocks/SM",
                  k.launch.blocks_per_sm, "WREG" if "Vec wr[ITERS]" in k.source else "-",
                  "registers", r.registers, "spills", r.spill_stores)
        return

    def entries_for(shape, pool):
        (dtype, hidden), labels = shape
        problem = Problem(hidden, dtype)
        prod = GpuEvaluator(problem, (1 << 26) // hidden, pool=pool)
        return dtype, hidden, [("prod", prod, KernelConfig.from_label(lab)) for lab in labels]

    run_plan("occupancy_lab_more" if args.more else "occupancy_lab", plan.items(), entries_for,
             args.rounds, args.out)


if __name__ == "__main__":
    main()
