"""Lab only (session 23): the bulk kernel's persistent grid cut to the fewest clusters that keep
its number of rounds of tiles.

The product launches as many clusters as can be resident (``LaunchPlan.grid``). Where the tiles
do not divide among them (bf16 16384: 4096 row tiles over 132 SMs, 31.03 each; bf16 32768: 2048
over 132, 15.5) a few SMs run one tile more while the rest have left: one tile's time with most
of the GPU idle. With ceil(tiles / rounds) clusters, rounds = ceil(tiles / resident), every
cluster runs the same number of tiles (128 SMs at 2048 or 4096 tiles), at the price of idle SMs
from the start; DRAM, not the SMs, bounds these kernels (NOTES.md 76). Same kernels, same
source: only the launch's grid differs. Variants: ``prod`` (as shipped), ``bal`` (the balanced
count), ``bal-N`` (N clusters fewer still, to see the trend), verified and timed interleaved.

    python benchmarks/lab/grid_lab.py --out $OUT --rounds 9   # GPU machine
"""

from __future__ import annotations

import dataclasses
from typing import Any

import lab_eval

from autonorm import codegen, compiler
from autonorm.evaluator import GpuEvaluator
from autonorm.space import KernelConfig, Problem


@dataclasses.dataclass(frozen=True)
class BalancedPlan(codegen.LaunchPlan):
    """The product's plan with its resident grid cut to the balanced count, less ``fewer``."""

    fewer: int = 0

    def grid(self, rows: int, sm_count: int, resident_clusters: int | None = None) -> int:
        clusters = super().grid(rows, sm_count, resident_clusters) // self.cluster
        tiles = -(-rows // self.rows_per_block)
        rounds = -(-tiles // clusters)
        balanced = -(-tiles // rounds)
        return max(1, balanced - self.fewer) * self.cluster


def balanced_render(fewer: int) -> lab_eval.Render:
    def render(config: Any, problem: Any, limits: Any) -> codegen.RenderedKernel:
        k = codegen.render(config, problem, limits)
        plan = BalancedPlan(**dataclasses.asdict(k.launch), fewer=fewer)
        return dataclasses.replace(k, launch=plan)

    return render


PLAN = {
    ("bfloat16", 16384): "t256v8r1-bulk-two_pass-c1-p0-s3",
    ("float16", 16384): "t256v8r1-bulk-two_pass-c1-p0-s3",
    ("bfloat16", 32768): "t512v8r1-bulk-two_pass-c1-p0-s2",
    ("float16", 32768): "t512v8r1-bulk-two_pass-c1-p0-s2",
    ("float32", 16384): "t512v4r1-bulk-two_pass-c1-p0-s2",
    ("bfloat16", 65536): "t256v8r1-bulk-two_pass-c4-p0-s3",
    ("float32", 32768): "t256v4r1-bulk-two_pass-c4-p0-s3",
}
VARIANTS = {"bal": 0, "bal-4": 4, "bal-8": 8}


def main() -> None:
    args = lab_eval.lab_arguments(offline=False).parse_args()

    def entries_for(shape: Any, pool: compiler.CompilePool) -> tuple[str, int, list]:
        (dtype, hidden), label = shape
        problem, rows = Problem(hidden, dtype), (1 << 26) // hidden
        config = KernelConfig.from_label(label)
        prod = GpuEvaluator(problem, rows, pool=pool)
        base = prod._compile(config).grid(rows)  # noqa: SLF001
        entries = [("prod", prod, config)]
        for name, fewer in VARIANTS.items():
            ev = lab_eval.RenderingEvaluator(balanced_render(fewer), problem, rows, pool=pool)
            grid = ev._compile(config).grid(rows)  # noqa: SLF001
            print(f"{dtype} {hidden} {name}: grid {grid} (shipped {base})", flush=True)
            entries.append((name, ev, config))
        return dtype, hidden, entries

    lab_eval.run_plan("grid_lab", PLAN.items(), entries_for, args.rounds, args.out)


if __name__ == "__main__":
    main()
