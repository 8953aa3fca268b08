"""Lab only (session 22): the warps' totals of a row summed by a butterfly, not in turn.

Every block reduction of the fwd and bulk templates ends with each lane reading and adding the
row's NWARP_G warp totals one after another: 8 loads and adds a reduction at 256 threads a row,
16-32 at 512-1024 (NOTES.md 100 found compile's 512-thread kernel shape losing to that merge in
its Welford form). The tree ``templates_merge`` (patch ``tree_patches/s22_warp_merge.patch``)
has each lane add a chunk of at most 4 totals and the warp add the chunks by butterfly
(``reduce.cuh.j2`` ``sum_totals``). This times the same configs from both trees, interleaved and
verified against float64: each shape's shipped winner and its 512-1024-thread neighbours.

    python benchmarks/lab/merge_lab.py --out $OUT        # GPU machine
    python benchmarks/lab/merge_lab.py --offline         # registers and spills, nvcc

The tree is untracked; build it from the repo root with ``cp -r templates
benchmarks/lab/templates_merge && (cd benchmarks/lab/templates_merge && patch -p3 <
../tree_patches/s22_warp_merge.patch)``.
"""

from __future__ import annotations

from pathlib import Path

import lab_eval
from tree_render import renderer

TREE = Path(__file__).parent / "templates_merge"


def both(labels: list[str]) -> list[tuple[str, str]]:
    return [(tag, lb) for lb in labels for tag in ("prod", "merge")]


R = "-registers-two_pass-c1-p0"
S = "-smem-two_pass-c1-p0"
PLAN = {
    ("float32", 4096): both(["t256v2r2" + R, "t512v4r1" + R, "t1024v4r1" + R, "t512v4r2" + R]),
    ("float32", 8192): both(["t256v4r1" + R, "t512v4r1" + R, "t1024v4r1-smem-two_pass-c1-p0"]),
    ("float32", 12288): both(["t512v4r1-bulk-two_pass-c1-p0-s3",
                              "t1024v4r1-bulk-two_pass-c1-p0-s2"]),
    ("float32", 16384): both(["t512v4r1-bulk-two_pass-c1-p0-s2",
                              "t1024v4r1-bulk-two_pass-c1-p0-s2"]),
    ("float32", 32768): both(["t256v4r1-bulk-two_pass-c4-p0-s3",
                              "t512v4r1-bulk-two_pass-c4-p0-s2"]),
    ("bfloat16", 4096): both(["t128v8r1" + S + "-m64", "t512v8r1" + R]),
    ("bfloat16", 12288): both(["t256v8r1" + S + "-m64", "t512v8r1" + S + "-m64"]),
    ("bfloat16", 16384): both(["t256v8r1" + S + "-m64", "t512v8r1" + S + "-m64",
                               "t1024v8r1" + S]),
    ("bfloat16", 32768): both(["t256v8r1-bulk-two_pass-c2-p0-s2",
                               "t512v8r1-bulk-two_pass-c2-p0-s3"]),
    ("bfloat16", 65536): both(["t256v8r1-bulk-two_pass-c4-p0-s3"]),
}

if __name__ == "__main__":
    lab_eval.run_tree_lab("merge_lab", PLAN, "merge", renderer(TREE))
