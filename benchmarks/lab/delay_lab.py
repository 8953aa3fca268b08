"""Lab only (session 23): the bulk kernel's other first tiles requested a fixed delay after
stage 0's, between "all at once" and "once stage 0 has landed" (shipped since NOTES.md 70).

70 measured the two ends: stage 0 alone, the rest once it has landed, ran x1.007-1.023 at 16-bit
32768-65536 against all S stages at once. If DRAM serves requests roughly in age order, asking
for the other stages a little before stage 0 lands keeps DRAM busy over the landing while stage 0
still lands first. Trees ``templates_d<D>`` (patch ``tree_patches/s23_first_delay.patch`` with
``@DELAY@`` set to D SM cycles; at ~1.98 GHz 1000 cycles ~0.5 us) against the product, the
same configs interleaved, verified against float64. The same run also times, in the product's
tree, the shapes that session 22's merge kept by its 1-point margin beside the config that
measured better there (fp16 16384 / 32768, bf16 16384), a head-to-head with more rounds.

    python benchmarks/lab/delay_lab.py --out $OUT --rounds 9   # GPU machine
    python benchmarks/lab/delay_lab.py --offline               # registers and spills, nvcc

Build the trees from the repo root: for D in 0 1000 2000 4000: ``cp -r templates
benchmarks/lab/templates_d$D && (cd benchmarks/lab/templates_d$D && patch -p3 <
../tree_patches/s23_first_delay.patch) && sed -i s/@DELAY@/$D/
benchmarks/lab/templates_d$D/layernorm_bulk.cu.j2``.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import lab_eval
from ab_lab import top_configs
from tree_render import renderer

HERE = Path(__file__).parent
DELAYS = (0, 1000, 2000, 4000)
BULK_SHAPES = [("bfloat16", 32768), ("bfloat16", 65536), ("float16", 32768), ("float16", 65536),
               ("float32", 12288), ("float32", 16384), ("float32", 32768), ("float32", 65536)]
# Session 22's merge kept these winners by its margin; the config that measured better there.
KEPT = {("bfloat16", 16384): "t256v8r1-bulk-two_pass-c1-p0-s3",
        ("float16", 16384): "t256v8r1-bulk-two_pass-c1-p0-s3",
        ("float16", 32768): "t512v8r1-bulk-two_pass-c1-p0-s2"}


def plan() -> dict[tuple[str, int], list[tuple[str, str]]]:
    """Each shape's (variant, label) entries; the product's winner first."""
    db = sqlite3.connect(HERE.parents[1] / "tuning_db" / "autonorm.db")
    out: dict[tuple[str, int], list[tuple[str, str]]] = {}
    for dtype, hidden in BULK_SHAPES + [k for k in KEPT if k not in BULK_SHAPES]:
        winner = top_configs(db, dtype, hidden, 1)[0].label()
        entries = [("prod", winner)]
        if (dtype, hidden) in KEPT:
            entries.append(("kept?", KEPT[dtype, hidden]))
        bulk = KEPT.get((dtype, hidden), winner)
        entries += [(f"d{d}", bulk) for d in DELAYS]
        out[dtype, hidden] = entries
    return out


def main() -> None:
    args = lab_eval.lab_arguments().parse_args()
    the_plan = plan()
    renders = {f"d{d}": renderer(HERE / f"templates_d{d}") for d in DELAYS}
    lab_eval.run_trees_lab("delay_lab", the_plan, renders, args)


if __name__ == "__main__":
    main()
