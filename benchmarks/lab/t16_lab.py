"""Lab only: a 16-bit bulk tile held in registers as packed 16-bit vectors (``templates_t16``).

The product's bulk kernel holds a 16-bit tile in registers only when it fits as fp32 (16
elements a thread, ``codegen.FP32_TILE_MAX``); longer tiles are read from shared memory in all
three passes, so their stage stays busy until the store pass (session 12 refills it after the
next iteration's first row-sum barrier, NOTES.md 61). In ``templates_t16`` such a tile leaves
shared memory once as packed 16-bit vectors (4 registers a vector: 32 at 64 elements a thread)
and its stage is refilled after the first row sum's barrier of the same iteration, as the fp32
tile's is; weights then come from L1 (their registers go to the tile), and one more tile is in
flight for the same stage count. An unclustered t1024 kernel at 65536 (one 128 KB stage plus
the row in registers, no cluster exchange) spilled 232-320 bytes at its 64-register cap (nvcc
13.0, `--offline`), so it is not in the plan.

Prediction (not yet measured): x1.00-1.03 at 16-bit 32768-65536 (s2 and s3 were within 1-2%,
so bytes in flight are not the limit there); x0.97-1.00 at 16384, where the weights leave
registers.

Run on the GPU machine: ``python benchmarks/lab/t16_lab.py --out $OUT`` (``--offline``: compile
the t16 kernels with nvcc here and print registers and spills, no GPU).
"""

from __future__ import annotations

from pathlib import Path

from lab_eval import run_tree_lab
from tree_render import templates_from

from autonorm import codegen

TREE = Path(__file__).resolve().parent / "templates_t16"
PLAN: dict[tuple[str, int], list[tuple[str, str]]] = {
    ("bfloat16", 32768): [("prod", "t512v8r1-bulk-two_pass-c1-p0-s2"),
                          ("t16", "t512v8r1-bulk-two_pass-c1-p0-s2"),
                          ("t16", "t512v8r1-bulk-two_pass-c1-p0-s3"),
                          ("t16", "t1024v8r1-bulk-two_pass-c1-p0-s2")],
    ("float16", 32768): [("prod", "t512v8r1-bulk-two_pass-c1-p0-s2"),
                         ("t16", "t512v8r1-bulk-two_pass-c1-p0-s2")],
    ("bfloat16", 65536): [("prod", "t512v8r1-bulk-two_pass-c2-p0-s3"),
                          ("t16", "t512v8r1-bulk-two_pass-c2-p0-s3"),
                          ("t16", "t1024v8r1-bulk-two_pass-c2-p0-s2")],
    ("float16", 65536): [("prod", "t512v8r1-bulk-two_pass-c2-p0-s2"),
                         ("t16", "t512v8r1-bulk-two_pass-c2-p0-s2")],
    ("bfloat16", 16384): [("prod", "t256v8r1-smem-two_pass-c1-p0-m64"),
                          ("prod", "t256v8r1-bulk-two_pass-c1-p0-s3"),
                          ("t16", "t256v8r1-bulk-two_pass-c1-p0-s3"),
                          ("t16", "t512v8r1-bulk-two_pass-c1-p0-s2")],
}


def render_t16(config, problem, limits):  # noqa: ANN001, ANN201 - lab_eval.Render
    with templates_from(TREE):
        return codegen.render(config, problem, limits)


def main() -> None:
    run_tree_lab("t16_lab", PLAN, "t16", render_t16)


if __name__ == "__main__":
    main()
