"""Lab only: the bulk kernel with tiles handed out dynamically (``templates_dyn``).

``timeline_lab.py`` (session 11, call B) showed the bulk winners' blocks finishing 15-20 us apart
although each gets 15 or 16 tiles: at bf16 32768 (71.8 us span) the first block exits at 51 us,
the median at 65 us, the last at 72 us, and the x arrival rate falls off over the last ~8 us.
The static round-robin (tile += clusters) cannot give a slow SM fewer tiles. In ``templates_dyn``
the first S tiles of every cluster go out statically and the rest to whichever cluster asks next
(one global atomic a tile, claimed one iteration ahead; a cluster's rank 0 claims and pushes the
claim into its blocks' shared memory by st.async). The counter is a module global reset by the
last cluster out: fine for a lab's serialized launches, not for the product.

Prediction: the spread of exits shrinks to about one tile (3-5 us) and the bulk winners gain
4-6% at 32768-65536 (x 1.04-1.06 single launches), less at 16384.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from lab_eval import run_tree_lab
from tree_render import templates_from

from autonorm import codegen

TREE = Path(__file__).resolve().parent / "templates_dyn"
PLAN: dict[tuple[str, int], list[tuple[str, str]]] = {
    ("bfloat16", 32768): [("prod", "t512v8r1-bulk-two_pass-c1-p0-s2"),
                          ("dyn", "t512v8r1-bulk-two_pass-c1-p0-s2"),
                          ("dyn", "t512v8r1-bulk-two_pass-c1-p0-s3")],
    ("float16", 32768): [("prod", "t512v8r1-bulk-two_pass-c1-p0-s3"),
                         ("dyn", "t512v8r1-bulk-two_pass-c1-p0-s3"),
                         ("dyn", "t512v8r1-bulk-two_pass-c1-p0-s2")],
    ("bfloat16", 65536): [("prod", "t512v8r1-bulk-two_pass-c2-p0-s2"),
                          ("dyn", "t512v8r1-bulk-two_pass-c2-p0-s2")],
    ("float16", 65536): [("prod", "t512v8r1-bulk-two_pass-c2-p0-s2"),
                         ("dyn", "t512v8r1-bulk-two_pass-c2-p0-s2")],
    ("float32", 32768): [("prod", "t512v4r1-bulk-two_pass-c2-p0-s2"),
                         ("dyn", "t512v4r1-bulk-two_pass-c2-p0-s2")],
    ("float32", 65536): [("prod", "t512v4r1-bulk-two_pass-c4-p0-s2"),
                         ("dyn", "t512v4r1-bulk-two_pass-c4-p0-s2")],
    ("float32", 16384): [("prod", "t512v4r1-bulk-two_pass-c1-p0-s3"),
                         ("dyn", "t512v4r1-bulk-two_pass-c1-p0-s3")],
    ("bfloat16", 16384): [("prod", "t256v8r1-smem-two_pass-c1-p0-m64"),
                          ("prod", "t512v8r1-bulk-two_pass-c1-p0-s2"),
                          ("dyn", "t512v8r1-bulk-two_pass-c1-p0-s2"),
                          ("dyn", "t256v8r1-bulk-two_pass-c1-p0-s3")],
    ("float32", 12288): [("prod", "t512v4r1-registers-two_pass-c1-p4"),
                         ("prod", "t512v4r1-bulk-two_pass-c1-p0-s3"),
                         ("dyn", "t512v4r1-bulk-two_pass-c1-p0-s3")],
    ("bfloat16", 12288): [("prod", "t256v8r1-smem-two_pass-c1-p0-m64"),
                          ("dyn", "t256v8r1-bulk-two_pass-c1-p0-s3"),
                          ("dyn", "t512v8r1-bulk-two_pass-c1-p0-s2")],
}


@contextlib.contextmanager
def dyn_tree():
    """Render from templates_dyn with its extra shared memory (the claim ring and stage tiles)."""
    shipped = codegen.smem_bytes

    def smem_bytes(config, problem):  # noqa: ANN001, ANN202 - codegen's signature
        extra = 0
        if config.cache == "bulk":
            s = max(config.stages, 1)
            q = max(2 * s, 4)
            extra = q * 8 + q * 4 + s * 4
        return shipped(config, problem) + extra

    codegen.smem_bytes = smem_bytes
    try:
        with templates_from(TREE):
            yield
    finally:
        codegen.smem_bytes = shipped


def render_dyn(config, problem, limits):  # noqa: ANN001, ANN201 - lab_eval.Render
    with dyn_tree():
        return codegen.render(config, problem, limits)


def main() -> None:
    run_tree_lab("dyn_lab", PLAN, "dyn", render_dyn)


if __name__ == "__main__":
    main()
