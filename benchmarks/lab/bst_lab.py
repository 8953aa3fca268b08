"""Lab only (session 21): y stored by the bulk engine, the stage refilled an iteration later.

Session 15's copies (NOTES.md 76, ``copy_lab.log``) put bulk loads with thread stores of 32 KB
tiles at x0.954 of cudaMemcpy and bulk loads with one bulk store of the rewritten stage at
x0.980; the LayerNorm kernel with bulk stores "as built" (the refill waiting for the store to
read its stage) ran x0.92-0.96 at c2. This tree (``templates_bst2``, patch
``tree_patches/s21_bulk_store_lagged.patch``) keeps the copies' order in the clustered kernels
(all the wide-row winners hold 32 KB segments): y written into the stage in place, thread 0
stores it behind the end-of-tile barrier, and the stage is refilled an iteration later, after
``cp.async.bulk.wait_group.read 1``. Compared interleaved against the product's kernels, all
verified against float64: each shape's winner and its neighbours in stages.

    python benchmarks/lab/bst_lab.py --out $OUT     # GPU machine
    python benchmarks/lab/bst_lab.py --offline      # registers and spills, nvcc

The tree is untracked; build it from the repo root with ``cp -r templates benchmarks/lab/templates_bst2 &&
patch benchmarks/lab/templates_bst2/layernorm_bulk.cu.j2 benchmarks/lab/tree_patches/s21_bulk_store_lagged.patch``.
"""

from __future__ import annotations

from pathlib import Path

import lab_eval
from tree_render import renderer

from autonorm import space

TREE = Path(__file__).parent / "templates_bst2"
# The tree's claim ring has two more slots (Q + 2): allocate them for every kernel of this
# process (24 bytes more shared memory for the product's kernels too, which they do not use).
_scratch = space.bulk_scratch_bytes
space.bulk_scratch_bytes = lambda stages, rows, cluster=1: _scratch(stages, rows, cluster) + 24


render_bst = renderer(TREE)


B = "-bulk-two_pass"


def pairs(labels: list[str]) -> list[tuple[str, str]]:
    return [(tag, lb) for lb in labels for tag in ("prod", "bst")]


PLAN = {
    ("bfloat16", 32768): pairs(["t256v8r1" + B + "-c2-p0-s2", "t256v8r1" + B + "-c2-p0-s3"]),
    ("bfloat16", 65536): pairs(["t256v8r1" + B + "-c4-p0-s3", "t256v8r1" + B + "-c4-p0-s2",
                                "t256v8r1" + B + "-c8-p0-s3"]),
    ("float16", 32768): pairs(["t256v8r1" + B + "-c2-p0-s2", "t256v8r1" + B + "-c2-p0-s3"]),
    ("float32", 32768): pairs(["t256v4r1" + B + "-c4-p0-s3", "t256v4r1" + B + "-c4-p0-s2"]),
    ("float32", 65536): pairs(["t256v4r1" + B + "-c8-p0-s2", "t256v4r1" + B + "-c8-p0-s3"]),
    ("bfloat16", 16384): pairs(["t256v8r1" + B + "-c2-p0-s3"]),
}

if __name__ == "__main__":
    lab_eval.run_tree_lab("bst_lab", PLAN, "bst", render_bst)
