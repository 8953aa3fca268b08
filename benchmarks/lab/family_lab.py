"""Which kernel families does the tuner's 24-trial search miss? Sample each, re-time the best.

Run on the GPU machine from the repo root:

    python benchmarks/lab/family_lab.py --only bfloat16:4096,float32:16384 --out $OUT

For each shape (rows = 2^26 / hidden) it takes the shipped DB's winner for that row bucket
(``ab_lab.top_configs``: its config, whatever templates it was tuned on) and a random sample of
each family of the space, verifies and times them all through the product's evaluator, then re-times the winner
and every family's best interleaved (``GpuEvaluator.retime``) so the ratios come from one run.
Prints one line per family and writes ``$OUT/family_lab.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from ab_lab import top_configs

from autonorm import compiler
from autonorm.device import query_device
from autonorm.evaluator import GpuEvaluator
from autonorm.space import KernelConfig, Problem, enumerate_space

Family = Callable[[KernelConfig, Problem], bool]

FAMILIES: dict[str, Family] = {
    # persistent grid, register cache: the next row's loads in flight (codegen.prefetches)
    "persist": lambda c, p: c.cache == "registers" and c.blocks_per_sm > 0 and c.cluster == 1
    and c.vec == p.max_vec,
    "registers": lambda c, p: c.cache == "registers" and c.blocks_per_sm == 0 and c.cluster == 1
    and c.vec == p.max_vec,
    "smem": lambda c, p: c.cache == "smem" and c.cluster == 1 and c.vec == p.max_vec
    and c.stats == "two_pass",
    # no row cache (Welford only): x read twice, the second time from L2, as torch.compile's
    # triton_red kernels do
    "none": lambda c, p: c.cache == "none" and c.cluster == 1 and c.vec == p.max_vec,
    "bulk": lambda c, p: c.cache == "bulk" and c.vec == p.max_vec,
    "cluster": lambda c, p: c.cache != "bulk" and c.cluster > 1 and c.vec == p.max_vec
    and c.stats == "two_pass",
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", required=True, help="comma list of dtype:hidden")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--per-family", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--budget-s", type=float, default=300)
    ap.add_argument("--out", default="/tmp/out")
    args = ap.parse_args()
    t0 = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(Path(__file__).parents[2] / "tuning_db" / "autonorm.db")
    limits = query_device().limits()
    pool = compiler.CompilePool()
    families = args.families.split(",")
    records = []
    for item in args.only.split(","):
        if time.time() - t0 > args.budget_s:
            print("budget spent", flush=True)
            break
        dtype, hidden = item.split(":")
        problem = Problem(int(hidden), dtype)
        rows = (1 << 26) // problem.hidden
        valid = enumerate_space(problem, limits)
        rng = random.Random(problem.hidden)
        # The shipped winner of this row bucket (ab_lab's query, rows = 2^26 / hidden).
        winner = next(iter(top_configs(db, problem.dtype, problem.hidden, 1)), None)
        plan: dict[str, list[KernelConfig]] = {"winner": [winner] if winner else []}
        for name in families:
            members = [c for c in valid if FAMILIES[name](c, problem) and c != winner]
            plan[name] = rng.sample(members, min(args.per_family, len(members)))
        ev = GpuEvaluator(problem, rows, pool=pool)
        ev.prepare([c for cs in plan.values() for c in cs])
        best: dict[str, tuple[KernelConfig, float]] = {}
        for name, configs in plan.items():
            for c in configs:
                o = ev.evaluate(c)
                rec = {"dtype": problem.dtype, "hidden": problem.hidden, "family": name,
                       "label": c.label(), "config": c.to_dict(), "status": o.status,
                       "max_rel_err": o.max_rel_err}
                if o.timing:
                    rec.update(us=o.timing.median_us, share=o.timing.share)
                    if name not in best or o.timing.median_us < best[name][1]:
                        best[name] = (c, o.timing.median_us)
                records.append(rec)
        names = list(best)
        timings = ev.retime([best[n][0] for n in names], args.rounds)
        base = timings[names.index("winner")].median_us if "winner" in best else None
        print(f"{problem.dtype:9s} {problem.hidden:6d} r{rows} copy={ev.copy_gbps:.0f} GB/s "
              f"({time.time() - t0:.0f} s)", flush=True)
        for n, t in zip(names, timings, strict=True):
            ratio = f"x{base / t.median_us:.3f}" if base else ""
            tried = sum(1 for r in records if r["dtype"] == problem.dtype
                        and r["hidden"] == problem.hidden and r["family"] == n)
            print(f"    {n:9s} {t.share * 100:5.1f}% {t.median_us:7.1f} us {ratio:7s} "
                  f"best of {tried}: {best[n][0].label()}", flush=True)
            records.append({"dtype": problem.dtype, "hidden": problem.hidden, "family": n,
                            "retimed": True, "label": best[n][0].label(),
                            "config": best[n][0].to_dict(), "us": t.median_us,
                            "share": t.share, "vs_winner": base / t.median_us if base else None})
        (out / "family_lab.json").write_text(json.dumps(records, indent=1))
        del ev
    pool.close()


if __name__ == "__main__":
    main()
