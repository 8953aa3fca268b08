"""Lab only (session 21): torch.compile's kernel at the 1024 shapes, in our space.

compile_dump.py (call s21b) showed torch.compile's LayerNorm at bf16/fp16/fp32 1024: a
persistent reduction of one warp a program (num_warps 1), one row a warp, the row in registers
(16-byte loads, L2 evict_last hints), no block barrier; 65,536 programs. Our space has that
kernel (32 threads, one row a block, register cache), but the tuner's 24 trials never sampled
it there. This times it and its neighbours (2 and 4 warp-rows a block) against each shape's
shipped winner, interleaved, every kernel verified against float64 first.

    python benchmarks/lab/warp_row_lab.py --out $OUT     # GPU machine
    python benchmarks/lab/warp_row_lab.py --offline      # registers and spills, nvcc
"""

from __future__ import annotations

import lab_eval

R = "-registers-two_pass-c1-p0"
S = "-smem-two_pass-c1-p0"
PLAN: dict[tuple[str, int], list[str]] = {
    ("bfloat16", 1024): ["t256v8r8" + S + "-m64", "t32v8r1" + R, "t64v8r2" + R,
                         "t128v8r4" + R, "t32v8r1" + S],
    ("float16", 1024): ["t128v8r4" + S + "-m64", "t32v8r1" + R, "t64v8r2" + R, "t128v8r4" + R],
    ("float32", 1024): ["t256v4r8" + R, "t32v4r1" + R, "t64v4r2" + R, "t128v4r4" + R],
    ("bfloat16", 768): ["t128v8r4" + R + "-m64", "t32v8r1" + R, "t64v8r2" + R],
    ("float32", 768): ["t128v4r4" + R, "t32v4r1" + R, "t64v4r2" + R],
    ("bfloat16", 2048): ["t256v8r4" + S + "-m64", "t32v8r1" + R, "t64v8r1" + R,
                         "t128v8r2" + R],
}


def main() -> None:
    lab_eval.run_label_lab("warp_row_lab", PLAN, "warp")


if __name__ == "__main__":
    main()
