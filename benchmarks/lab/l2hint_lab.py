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

Call s25b (``--policies fwdkeep --shapes ...``): the fwd kernel's x loads (``ld.global.nc`` and
the smem fill's ``cp.async``) with the same evict_last policy, at the fwd kernel's winners; tree
``templates_fwdkeep`` from ``tree_patches/s25_fwd_x_keep.patch`` on the templates of 1aa5d9d
(hash e31221153f6e): ``cp -r templates benchmarks/lab/templates_fwdkeep && (cd
benchmarks/lab/templates_fwdkeep && patch layernorm_fwd.cu.j2 <
../tree_patches/s25_fwd_x_keep.patch)``.

Call s24h (``--policies evict_last,evict_last_half``): after evict_first cost x0.95-0.98, the
opposite, x's lines kept; ``evict_last_half`` is the same tree with the policy's fraction 1.0 set
to 0.5 (half of x's lines hinted, the rest unchanged).

The patches apply to the templates of bec69b6 (hash 813277effbea; since e17d13f the product
renders the evict_last tree as ``keep_x``). From the repo root: ``mkdir base && git archive
bec69b6 templates | tar -x -C base``; then for P in evict_first evict_unchanged: ``cp -r
base/templates benchmarks/lab/templates_$P && (cd benchmarks/lab/templates_$P && patch -p1 <
../tree_patches/s24_x_cache_hint.patch) && sed -i s/@POLICY@/$P/
benchmarks/lab/templates_$P/layernorm_bulk.cu.j2``.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import lab_eval
from ab_lab import top_configs
from tree_render import renderer

HERE = Path(__file__).parent
POLICIES = ("evict_first", "evict_unchanged")  # call s24g; s24h: --policies
SHAPES = [("bfloat16", 32768), ("bfloat16", 65536), ("float16", 32768), ("float16", 65536),
          ("bfloat16", 16384), ("bfloat16", 12288), ("float32", 16384), ("float32", 32768),
          ("float32", 65536)]


def plan(policies: tuple[str, ...], shapes: list[tuple[str, int]] = SHAPES,
         ) -> dict[tuple[str, int], list[tuple[str, str]]]:
    """Each shape's (variant, label) entries: the shipped winner in every tree."""
    db = sqlite3.connect(HERE.parents[1] / "tuning_db" / "autonorm.db")
    out: dict[tuple[str, int], list[tuple[str, str]]] = {}
    for dtype, hidden in shapes:
        winner = top_configs(db, dtype, hidden, 1)[0].label()
        out[dtype, hidden] = [("prod", winner)] + [(p, winner) for p in policies]
    return out


def main() -> None:
    ap = lab_eval.lab_arguments()
    ap.add_argument("--policies", default=",".join(POLICIES),
                    help="tree suffixes, comma-separated (templates_<policy>)")
    ap.add_argument("--shapes", default="",
                    help="dtype:hidden pairs, comma-separated (default: the nine bulk winners)")
    args = ap.parse_args()
    policies = tuple(args.policies.split(","))
    shapes = ([(d, int(h)) for d, h in (p.split(":") for p in args.shapes.split(","))]
              if args.shapes else SHAPES)
    the_plan = plan(policies, shapes)
    renders = {p: renderer(HERE / f"templates_{p}") for p in policies}
    lab_eval.run_trees_lab("l2hint_lab", the_plan, renders, args)


if __name__ == "__main__":
    main()
