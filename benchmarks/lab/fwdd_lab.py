"""Lab only: the fwd kernel's persistent grid with rows claimed dynamically (``templates_fwdd``).

``timeline_lab.py`` (session 11, call B) put the fwd winner at bf16 16384 (one block a row, p0)
at 480 of its 528 block slots busy on average, and ended over ~6 us; the persistent grid of the
same kernel (p4, static stride) ran 87.7% against p0's 92.7% (NOTES 51). In ``templates_fwdd``
a persistent smem two-pass kernel (one row a block, cluster 1) takes its first row statically
and claims every later one with an atomic on a module-global counter (claimed at the top of an
iteration, published in shared memory before pass 1's barrier), as the bulk kernel's dynamic
schedule does (NOTES 57). Lab only: the counter is shared by every launch of the module.

Prediction: the dynamic p4 kernel at least matches p0 at 16-bit 8192-16384 (no block launch
turnover, same occupancy) and beats static p4 by 4-5 points; a gain over p0 of 1-2 points at
most, since the tail (the last rows' ~9 us) stays.
"""

from __future__ import annotations

from pathlib import Path

from lab_eval import run_tree_lab
from tree_render import renderer

TREE = Path(__file__).resolve().parent / "templates_fwdd"
W256 = "t256v8r1-smem-two_pass-c1-p{}-m64"
PLAN: dict[tuple[str, int], list[tuple[str, str]]] = {
    ("bfloat16", 16384): [("prod", W256.format(0)), ("prod", W256.format(4)),
                          ("fwdd", W256.format(4)), ("fwdd", W256.format(2)),
                          ("fwdd", W256.format(0))],
    ("float16", 16384): [("prod", W256.format(0)), ("fwdd", W256.format(4))],
    ("bfloat16", 12288): [("prod", W256.format(0)), ("prod", W256.format(4)),
                          ("fwdd", W256.format(4))],
    ("float16", 12288): [("prod", W256.format(0)), ("fwdd", W256.format(4))],
    ("bfloat16", 8192): [("prod", W256.format(0)), ("fwdd", W256.format(4))],
    ("bfloat16", 32768): [("prod", "t512v8r1-bulk-two_pass-c1-p0-s3"),
                          ("prod", "t512v8r1-smem-two_pass-c1-p0-m64"),
                          ("fwdd", "t512v8r1-smem-two_pass-c1-p2-m64")],
}


render_fwdd = renderer(TREE)


def main() -> None:
    run_tree_lab("fwdd_lab", PLAN, "fwdd", render_fwdd,
                 lambda k: "dynamic" if "fd_ctr" in k.source else "STATIC")


if __name__ == "__main__":
    main()
