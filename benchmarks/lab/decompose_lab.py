"""Lab only: what the wide-row winners pay for, timed side by side in one run.

ncu at bf16 16384 (session 8, call H) put our smem winner's L2 throughput at 84.8% of peak with
DRAM at 73.3% and an L1 hit rate of 38.6%: the weight and bias every row re-reads (64 KB per row
in 16-bit at 16384) partly miss L1 and add to the L2's load. For each shape's shipped winner this
times, interleaved on the same GPU:

- ``base``: the winner as shipped;
- ``noaff``: the same config on a problem without weight and bias (what the affine loads cost);
- ``evl``: weight and bias read with L1 evict_last priority (``templates_evl``, fwd kernel only);
- ``cs``: y stored streaming, st.global.cs (``templates_cs``, fwd kernel only);
- ``m40`` / ``m40noaff``: a 40-register cap (6 blocks per SM) with and without weight and bias,
  for the 16-bit smem winners (session 8's cap ran x0.95; is it the L1?).

Every variant is verified against float64 by the product's evaluator first; the ratio is to the
shape's first variant. ``--plan`` times other configs under these variants (call B: rows per
block and clusters at 12288-16384).

Build the tree(s) first (templates_evl / templates_cs): ``benchmarks/lab/tree_patches/README.md``.
Run from the repo root on the GPU machine: ``python benchmarks/lab/decompose_lab.py --out $OUT``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ab_lab import BaseEvaluator
from lab_eval import lab_arguments, run_plan

from autonorm import compiler, space
from autonorm.evaluator import GpuEvaluator
from autonorm.space import KernelConfig, Problem

LAB = Path(__file__).parent
SHAPES = (
    ("bfloat16", 8192, "t256v8r1-smem-two_pass-c1-p0-m64"),
    ("bfloat16", 12288, "t256v8r1-smem-two_pass-c1-p0-m64"),
    ("bfloat16", 16384, "t256v8r1-smem-two_pass-c1-p0-m64"),
    ("float16", 16384, "t256v8r1-smem-two_pass-c1-p0-m64"),
    ("float32", 12288, "t512v4r1-registers-two_pass-c1-p4"),
    ("float32", 16384, "t512v4r1-bulk-two_pass-c1-p0-s3"),
    ("bfloat16", 32768, "t512v8r1-bulk-two_pass-c1-p0-s2"),
    ("bfloat16", 65536, "t512v8r1-bulk-two_pass-c2-p0-s2"),
)


def tree_evaluator(problem: Problem, rows: int, pool: compiler.CompilePool,
                   tree: str) -> BaseEvaluator:
    ev = BaseEvaluator(problem, rows, pool=pool)
    ev.base_dir = (LAB / tree).resolve()
    return ev


def default_plan() -> dict[tuple[str, int], list[tuple[str, str]]]:
    """Call A's plan: each shape's winner under every variant that applies to it."""
    plan: dict[tuple[str, int], list[tuple[str, str]]] = {}
    for dtype, hidden, label in SHAPES:
        cfg = KernelConfig.from_label(label)
        variants = [(label, "base"), (label, "noaff")]
        if cfg.cache != "bulk":
            variants += [(label, "evl"), (label, "cs")]
        if cfg.cache == "smem" and dtype != "float32":
            m40 = dataclasses.replace(cfg, max_regs=40).label()
            variants += [(m40, "base"), (m40, "noaff")]
        plan[dtype, hidden] = variants
    return plan


def parse_plan(text: str) -> dict[tuple[str, int], list[tuple[str, str]]]:
    """``dtype:hidden:label:variant,...`` (variant: base, noaff, evl or cs), grouped by shape."""
    plan: dict[tuple[str, int], list[tuple[str, str]]] = {}
    for item in text.split(","):
        dtype, hidden, label, variant = item.split(":")
        plan.setdefault((dtype, int(hidden)), []).append((label, variant))
    return plan


def shape_entries(shape: tuple[tuple[str, int], list[tuple[str, str]]],
                  pool: compiler.CompilePool) -> tuple[str, int, list]:
    """One shape's (variant, evaluator, config) entries; invalid ones are printed and left out."""
    (dtype, hidden), wanted = shape
    rows = (1 << 26) // hidden
    problem = Problem(hidden, dtype)
    evs = {"base": GpuEvaluator(problem, rows, pool=pool),
           "noaff": GpuEvaluator(Problem(hidden, dtype, has_weight=False, has_bias=False),
                                 rows, pool=pool)}
    variants = []
    for label, kind in wanted:
        if kind not in evs:
            evs[kind] = tree_evaluator(problem, rows, pool, f"templates_{kind}")
        cfg = KernelConfig.from_label(label)
        why = space.check(cfg, evs[kind].problem)
        if why:
            print(f"{dtype:8s} {hidden:6d} {kind:6s} {label}: invalid: {why}", flush=True)
            continue
        variants.append((kind, evs[kind], cfg))
    return dtype, hidden, variants


def main() -> None:
    ap = lab_arguments(offline=False)
    ap.add_argument("--plan", default="", help="dtype:hidden:label:variant,... (default: call A's)")
    args = ap.parse_args()
    space.MAX_REGS = (0, 40, 64)  # this process only
    plan = parse_plan(args.plan) if args.plan else default_plan()
    run_plan("decompose_lab", plan.items(), shape_entries, args.rounds, args.out)


if __name__ == "__main__":
    main()
