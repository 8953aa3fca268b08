"""Lab only (session 24): the bulk kernel's x copies with an L2 eviction-priority hint.

The bulk-copy engine's loads of x carry the default L2 policy, so x's lines, read once, age in
L2 like y's dirty ones. Hinted ``evict_first`` they leave first: no DRAM byte changes, but what
L2 keeps while the kernel runs does. ``evict_unchanged`` is the control (the same hint
machinery, the default priority): it measures the cost of ``createpolicy`` and the hinted form.
Trees ``templates_evict_first`` and ``templates_evict_unchanged`` (patch
``tree_patches/s24_x_cache_hint.patch`` with ``@POLICY@`` set) against the product, the shipped
bulk winners, interleaved, verified against float64.

    python benchmarks/lab/l2hint_lab.py --out $OUT --rounds 9   # GPU machine
    python benchmarks/lab/l2hint_lab.py --offline               # registers and spills, nvcc

Call s24h (``--policies evict_last,evict_last_half``): after evict_first cost x0.95-0.98, the
opposite, x's lines kept; ``evict_last_half`` is the same tree with the policy's fraction 1.0 set
to 0.5 (half of x's lines hinted, the rest unchanged). Build the trees from the repo root: for P
in evict_first evict_unchanged: ``cp -r templates
benchmarks/lab/templates_$P && (cd benchmarks/lab/templates_$P && patch -p1 <
../tree_patches/s24_x_cache_hint.patch) && sed -i s/@POLICY@/$P/
benchmarks/lab/templates_$P/layernorm_bulk.cu.j2``.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import lab_eval
from ab_lab import top_configs
from tree_render import renderer

from autonorm import compiler
from autonorm.evaluator import GpuEvaluator
from autonorm.space import H200, KernelConfig, Problem

HERE = Path(__file__).parent
POLICIES = ("evict_first", "evict_unchanged")  # call s24g; s24h: --policies
SHAPES = [("bfloat16", 32768), ("bfloat16", 65536), ("float16", 32768), ("float16", 65536),
          ("bfloat16", 16384), ("bfloat16", 12288), ("float32", 16384), ("float32", 32768),
          ("float32", 65536)]


def plan(policies: tuple[str, ...]) -> dict[tuple[str, int], list[tuple[str, str]]]:
    """Each shape's (variant, label) entries: the shipped winner in every tree."""
    db = sqlite3.connect(HERE.parents[1] / "tuning_db" / "autonorm.db")
    out: dict[tuple[str, int], list[tuple[str, str]]] = {}
    for dtype, hidden in SHAPES:
        winner = top_configs(db, dtype, hidden, 1)[0].label()
        out[dtype, hidden] = [("prod", winner)] + [(p, winner) for p in policies]
    return out


def main() -> None:
    ap = lab_eval.lab_arguments()
    ap.add_argument("--policies", default=",".join(POLICIES),
                    help="tree suffixes, comma-separated (templates_<policy>)")
    args = ap.parse_args()
    policies = tuple(args.policies.split(","))
    the_plan = plan(policies)
    renders = {p: renderer(HERE / f"templates_{p}") for p in policies}
    if args.offline:
        for t, render in renders.items():  # one tree a file: the trees' kernels share names
            kernels = [render(KernelConfig.from_label(label), Problem(h, d), H200)
                       for (d, h), entries in the_plan.items() for tt, label in entries
                       if tt == t]
            reports = compiler.compile_offline(kernels, "sm_90")
            for k in kernels:
                r = reports[k.name]
                print(t, k.problem.dtype, k.problem.hidden, k.config.label(), "registers",
                      r.registers, "spill stores", r.spill_stores)
        return

    def entries_for(shape: Any, pool: compiler.CompilePool) -> tuple[str, int, list]:
        (dtype, hidden), entries = shape
        problem, rows = Problem(hidden, dtype), (1 << 26) // hidden
        prod = GpuEvaluator(problem, rows, pool=pool)
        evs = {t: lab_eval.RenderingEvaluator(r, problem, rows, pool=pool)
               for t, r in renders.items()}
        return dtype, hidden, [(t, evs.get(t, prod), KernelConfig.from_label(label))
                               for t, label in entries]

    lab_eval.run_plan("l2hint_lab", the_plan.items(), entries_for, args.rounds, args.out)


if __name__ == "__main__":
    main()
