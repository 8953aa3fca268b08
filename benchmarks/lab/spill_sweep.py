"""Registers and spills of the same kernels rendered from two template trees (ptxas, no GPU).

    python benchmarks/lab/spill_sweep.py --base benchmarks/lab/templates_base \
        --new benchmarks/lab/templates_cap --winners
    python benchmarks/lab/spill_sweep.py --base ... --new ... --sample 10

``--winners`` takes the shipped DB's 16-bit winners without the bulk kernel (deduplicated);
``--sample K`` takes K random register / shared-memory two-pass configs per 16-bit shape of the
grid. Each tree's kernels compile together with nvcc (``compiler.compile_offline``); the script
prints one line per winner (registers and spills, base -> new) or a summary per tree.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import sqlite3
from pathlib import Path

from tree_render import templates_from

from autonorm import codegen, compiler
from autonorm.space import H200, KernelConfig, Problem, enumerate_space

GRID = (768, 1024, 2048, 4096, 8192, 12288, 16384)


def render_from(tree: str, config: KernelConfig, problem: Problem) -> codegen.RenderedKernel:
    """Render ``config`` with the templates of ``tree`` (autonorm's own codegen)."""
    with templates_from(tree):
        return codegen.render(config, problem, H200)


def winners() -> list[tuple[Problem, KernelConfig]]:
    db = sqlite3.connect(Path(__file__).parents[2] / "tuning_db" / "autonorm.db")
    rows = sorted(set(db.execute(
        "select dtype, hidden, config from winners where dtype != 'float32'").fetchall()))
    out = [(Problem(h, d), KernelConfig.from_dict(json.loads(c))) for d, h, c in rows]
    return [(p, c) for p, c in out if c.cache != "bulk"]


def sample(k: int) -> list[tuple[Problem, KernelConfig]]:
    rng = random.Random(0)
    out = []
    for dtype in ("bfloat16", "float16"):
        for hidden in GRID:
            problem = Problem(hidden, dtype)
            cands = [c for c in enumerate_space(problem, H200)
                     if c.cache in ("registers", "smem") and c.vec == problem.max_vec
                     and c.stats == "two_pass" and c.cluster == 1]
            rng.shuffle(cands)
            out += [(problem, c) for c in cands[:k]]
    return out


def compile_tree(tree: str, plan: list[tuple[Problem, KernelConfig]]) -> list[tuple[int, bool]]:
    kernels = [render_from(tree, c, p) for p, c in plan]
    reports: dict[str, compiler.PtxasReport] = {}
    for i in range(0, len(kernels), 60):  # one nvcc run per 60 kernels
        reports.update(compiler.compile_offline(kernels[i:i + 60], "sm_90"))
    return [(reports[k.name].registers, reports[k.name].spills) for k in kernels]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--winners", action="store_true")
    ap.add_argument("--sample", type=int, default=0)
    args = ap.parse_args()
    plan = winners() if args.winners else sample(args.sample or 10)
    results = {tree: compile_tree(tree, plan) for tree in (args.base, args.new)}
    if args.winners:
        for (p, c), before, after in zip(plan, results[args.base], results[args.new],
                                         strict=True):
            print(f"{p.dtype:9s} {p.hidden:6d} {c.label():40s} {before} -> {after}")
        return
    for tree, res in results.items():
        spilled = [c.label() for (_, c), (_, s) in zip(plan, res, strict=True) if s]
        regs = sorted(collections.Counter(r for r, _ in res).items())
        print(f"{tree}: {len(res)} kernels, {len(spilled)} spill {spilled[:6]}; registers {regs}")


if __name__ == "__main__":
    main()
