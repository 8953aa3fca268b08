"""Lab only (session 22): y by streaming stores (``st.global.cs``) in the fwd kernel.

The bulk kernel stores y evict-first since session 1 (NOTES.md 8: bf16 65536 c4 46.6% ->
67.9%); the fwd kernel, which holds every winner from 768 to 16384 (12288 in fp32), stores
plainly. Session 1 measured ``.cs`` stores on an older fwd template at x1.015 on average
(0.96-1.30) without adopting them there. This times each fwd shape's shipped winner and the
next verified two-pass config of the shipped DB from the product's templates and from the tree
``templates_cs`` (patch ``tree_patches/s22_fwd_cs_stores.patch``), interleaved, verified against
float64, in both timing regimes (rotated inputs; single launches after an L2 flush).

    python benchmarks/lab/cs_lab.py --out $OUT        # GPU machine
    python benchmarks/lab/cs_lab.py --offline         # registers and spills, nvcc

Build the untracked tree from the repo root with ``cp -r templates benchmarks/lab/templates_cs &&
(cd benchmarks/lab/templates_cs && patch -p3 < ../tree_patches/s22_fwd_cs_stores.patch)``.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import lab_eval
from ab_lab import top_configs
from tree_render import renderer

TREE = Path(__file__).parent / "templates_cs"
SHAPES = [(d, h) for d in ("bfloat16", "float16", "float32")
          for h in (768, 1024, 2048, 4096, 8192, 12288, 16384)]


def plan() -> dict[tuple[str, int], list[tuple[str, str]]]:
    db = sqlite3.connect(Path(__file__).parents[2] / "tuning_db" / "autonorm.db")
    out = {}
    for dtype, hidden in SHAPES:
        configs = [c for c in top_configs(db, dtype, hidden, 4)
                   if c.cache != "bulk" and c.stats == "two_pass"][:2]
        out[dtype, hidden] = [(tag, c.label()) for c in configs for tag in ("prod", "cs")]
    return out


if __name__ == "__main__":
    lab_eval.run_tree_lab("cs_lab", plan(), "cs", renderer(TREE))
