"""Lab only (session 22): plain y stores in the bulk kernel, against its streaming ones.

The bulk kernel stores y evict-first (``__stcs``) since session 1, when the first bulk kernel
ran bf16 65536 c4 at 47% of copy with plain stores and 68% with streaming ones (NOTES.md 8).
cs_lab.py (call s22c) found the opposite in today's fwd kernel: streaming stores x0.97-1.00 on
its winners. This times each bulk shape's shipped winner and next verified bulk configs from the
product's templates and from ``templates_plain`` (patch
``tree_patches/s22_bulk_plain_stores.patch``), interleaved, verified against float64, in both
timing regimes.

    python benchmarks/lab/plain_lab.py --out $OUT        # GPU machine
    python benchmarks/lab/plain_lab.py --offline         # registers and spills, nvcc

Build the untracked tree from the repo root with ``cp -r templates benchmarks/lab/templates_plain
&& (cd benchmarks/lab/templates_plain && patch -p3 < ../tree_patches/s22_bulk_plain_stores.patch)``.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import lab_eval
from ab_lab import top_configs
from tree_render import renderer

TREE = Path(__file__).parent / "templates_plain"
SHAPES = [("bfloat16", 32768), ("bfloat16", 65536), ("float16", 32768), ("float16", 65536),
          ("float32", 12288), ("float32", 16384), ("float32", 32768), ("float32", 65536),
          ("bfloat16", 16384)]


def plan() -> dict[tuple[str, int], list[tuple[str, str]]]:
    db = sqlite3.connect(Path(__file__).parents[2] / "tuning_db" / "autonorm.db")
    out = {}
    for dtype, hidden in SHAPES:
        winner = [c for c in top_configs(db, dtype, hidden, 1) if c.cache == "bulk"]
        configs = list(dict.fromkeys(winner + top_configs(db, dtype, hidden, 2, "bulk")))[:3]
        out[dtype, hidden] = [(tag, c.label()) for c in configs for tag in ("prod", "plain")]
    return out


if __name__ == "__main__":
    lab_eval.run_tree_lab("plain_lab", plan(), "plain", renderer(TREE))
