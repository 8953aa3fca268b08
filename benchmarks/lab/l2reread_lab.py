"""Lab only (session 21): torch.compile's structure at the shapes where it leads us.

compile_dump.py (call s21a) showed what torch.compile runs at fp32 4096 and fp16 16384: a
looped reduction, one row a program of 512 threads (R0_BLOCK 2048, 16 warps, 32 registers at
fp32 4096), Welford over 2048-element chunks, then the row read again from L2 for the store
pass; the first read is hinted L2 evict_last, the second evict_first. Our space has that
structure as ``cache="none", stats="welford"``, but the search's 24 trials found it at 85% of
copy at best (t128v4r2). This compares, interleaved and verified against float64, each shape's
shipped winner with our none/welford kernels at compile's block sizes, plain (``prod``) and with
compile's L2 policies (``hint``, the tree ``templates_hint``, patch
``tree_patches/s21_l2_hints.patch``).

    python benchmarks/lab/l2reread_lab.py --out $OUT        # GPU machine
    python benchmarks/lab/l2reread_lab.py --offline         # registers and spills, nvcc

The tree is untracked; build it from the repo root with ``cp -r templates benchmarks/lab/templates_hint &&
patch benchmarks/lab/templates_hint/layernorm_fwd.cu.j2 benchmarks/lab/tree_patches/s21_l2_hints.patch``.
"""

from __future__ import annotations

from pathlib import Path

import lab_eval
from tree_render import renderer

from autonorm import space

# compile's kernel holds 32 registers (4 blocks of 512 an SM); fp32 caps are admitted in this
# process only, as in fp32cap_lab.py (the lab's check is nvcc's: --offline).
space.MAX_REGS = (0, 32, 40, 48, 56, 64, 72, 80)
space._max_regs_reasons = lambda *a, **k: []  # noqa: SLF001
# Call s21c: two-pass statistics over a row read again from global memory (L2), which the
# space forbids (it wants a row cache): fp32 reads the row three times (two of them from L2),
# 16-bit twice (its fused pass, codegen.fuses_passes). This process only.
_check = space.check
space.check = lambda *a, **k: [r for r in _check(*a, **k) if "need a row cache" not in r]
HINT = Path(__file__).parent / "templates_hint"
W = "-none-welford-c1-p0"


render_hint = renderer(HINT)


T = "-none-two_pass-c1-p0"


def both(labels: list[str]) -> list[tuple[str, str]]:
    return [(tag, lb) for lb in labels for tag in ("prod", "hint")]


PLAN = {
    ("float32", 4096): [("prod", "t256v2r2-registers-two_pass-c1-p0")] + both(
        ["t512v4r1" + T, "t512v4r1" + T + "-m32", "t1024v4r1" + T, "t256v4r1" + T,
         "t512v2r1" + T, "t256v4r2" + T]) + [("hint", "t256v4r1" + W)],
    ("float16", 16384): [("prod", "t256v8r1-smem-two_pass-c1-p0-m64")] + both(
        ["t512v8r1" + T, "t1024v8r1" + T, "t256v8r1" + T, "t512v8r1" + T + "-m40"]),
    ("bfloat16", 16384): [("prod", "t256v8r1-smem-two_pass-c1-p0-m64")] + both(
        ["t512v8r1" + T, "t1024v8r1" + T, "t256v8r1" + T]),
    ("bfloat16", 12288): [("prod", "t256v8r1-smem-two_pass-c1-p0-m64")] + both(
        ["t512v8r1" + T, "t256v8r1" + T, "t1024v8r1" + T]),
    ("float32", 8192): [("prod", "t256v4r1-registers-two_pass-c1-p0")] + both(
        ["t512v4r1" + T, "t1024v4r1" + T, "t256v4r1" + T]),
}

if __name__ == "__main__":
    lab_eval.run_tree_lab("l2reread_lab", PLAN, "hint", render_hint)
