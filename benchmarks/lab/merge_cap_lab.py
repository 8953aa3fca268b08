"""Lab only (session 22): compile's fp32 4096 shape (512 threads, 32 registers, four blocks an
SM) under register caps, from the product's templates and from ``templates_merge``.

merge_lab.py (call s22a) found the butterfly merge of the warps' totals x1.08-1.33 on rows of
16-32 warps, yet still 25-70 points under the winners: at 38-64 registers such blocks fit one or
two an SM. fp32 caps are not in the space (NOTES.md 34, 66: capped fp32 kernels spill); this
process admits them, as fp32cap_lab.py does, and nvcc (``--offline``) is the spill check.

    python benchmarks/lab/merge_cap_lab.py --out $OUT     # GPU machine
    python benchmarks/lab/merge_cap_lab.py --offline      # registers and spills, nvcc
"""

from __future__ import annotations

import lab_eval
from merge_lab import TREE, both
from tree_render import renderer

from autonorm import space

space.MAX_REGS = (0, 32, 40, 48, 56, 64, 72, 80)  # this process only
space._max_regs_reasons = lambda *a, **k: []  # noqa: SLF001 - the lab's own check is nvcc's

R = "-registers-two_pass-c1-p0"
PLAN = {
    ("float32", 4096): [("prod", "t256v2r2" + R)] + both(
        ["t512v4r1" + R + "-m32", "t512v4r1" + R + "-m40", "t512v4r2" + R + "-m40",
         "t1024v4r1" + R + "-m32", "t256v4r1" + R + "-m64", "t512v2r1" + R + "-m32"]),
    ("float32", 8192): [("prod", "t256v4r1" + R)] + both(
        ["t512v4r1" + R + "-m48", "t512v4r1" + R + "-m64", "t512v4r2" + R + "-m64"]),
}

if __name__ == "__main__":
    lab_eval.run_tree_lab("merge_cap_lab", PLAN, "merge", renderer(TREE))
