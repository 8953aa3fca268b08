"""A/B a template change on the GPU: the same configurations rendered from two template trees.

Run on the GPU machine from the repo root:

    python benchmarks/lab/ab_lab.py --base benchmarks/lab/templates_base --out $OUT

``--base`` holds the templates before the change, e.g. ``mkdir -p benchmarks/lab/templates_base
&& git archive HEAD templates | tar -x --strip-components=1 -C benchmarks/lab/templates_base``
(an untracked folder, so the device run carries it); the working tree's
``templates/`` are the change. For each shape it takes the shipped DB's best distinct configs,
renders both variants with autonorm's own codegen, compiles them in autonorm's compile pool,
verifies both against float64 through the product's evaluator (outputs poisoned), then times
them interleaved (base, new, base, new, ...) on the same rotated inputs; the ratio new / base of
the medians of rounds is the result. Prints per-config lines and a per-shape summary; JSON to
``$OUT/ab_lab.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sqlite3
import statistics
import time
from pathlib import Path

from tree_render import templates_from

from autonorm import codegen, compiler, space
from autonorm.evaluator import GpuEvaluator
from autonorm.space import KernelConfig, Problem, derive_shape, rows_bucket

GRID = (768, 1024, 2048, 4096, 8192, 12288, 16384, 32768, 65536)
SHAPES = [(d, h) for d in ("bfloat16", "float16", "float32") for h in GRID]


class BaseEvaluator(GpuEvaluator):
    """The product's evaluator, rendering from another template tree."""

    base_dir: Path | None = None
    base_tile_max: int = codegen.FP32_TILE_MAX

    def _render(self, config: KernelConfig) -> codegen.RenderedKernel:
        rendered = self._rendered.get(config)
        if rendered is None and self.base_dir is None:
            rendered = self._rendered[config] = codegen.render(config, self.problem, self.limits)
        if rendered is None:
            # The base's fp32-tile limit (0 for trees from before the tile): the base renders
            # as it shipped.
            with templates_from(self.base_dir, self.base_tile_max):
                rendered = codegen.render(config, self.problem, self.limits)
            self._rendered[config] = rendered
        return rendered


def top_configs(db: sqlite3.Connection, dtype: str, hidden: int, k: int,
                cache: str = "") -> list[KernelConfig]:
    # The shipped DB keeps no timings of its trials: the winner first, then other configs that
    # verified there, cache kinds spread (registers, smem, bulk first).
    win = db.execute("select config from winners where dtype=? and hidden=? and rows_bucket=?",
                     (dtype, hidden, rows_bucket((1 << 26) // hidden))).fetchall()
    rest = db.execute(
        "select distinct config from trials where dtype=? and hidden=? and status='ok' "
        "and rows_bucket=?", (dtype, hidden, rows_bucket((1 << 26) // hidden))).fetchall()
    order = {"registers": 0, "smem": 1, "bulk": 2, "none": 3}
    rest = sorted((r for r in rest if r not in win),
                  key=lambda r: order[json.loads(r[0])["cache"]])
    picked, seen = list(win), {json.loads(r[0])["cache"] for r in win}
    for r in rest:
        kind = json.loads(r[0])["cache"]
        if kind not in seen or len(picked) >= len(order):
            picked.append(r)
            seen.add(kind)
    rows = picked[:k]
    if cache:  # only this cache kind, the fastest verified trial configs first
        best = db.execute(
            "select config, max(share) from trials where dtype=? and hidden=? and status='ok' "
            "and rows_bucket=? group by config order by max(share) desc",
            (dtype, hidden, rows_bucket((1 << 26) // hidden))).fetchall()
        rows = [(r[0],) for r in best if json.loads(r[0])["cache"] == cache][:k]
    return [KernelConfig.from_dict(json.loads(r[0])) for r in rows]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--new", default="", help="templates of the change (default: templates/)")
    ap.add_argument("--cache", default="", help="only configs of this cache kind")
    ap.add_argument("--out", default="/tmp/out")
    ap.add_argument("--top", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--budget-s", type=float, default=300)
    ap.add_argument("--only", default="", help="comma list of dtype:hidden")
    ap.add_argument("--ftile", action="store_true",
                    help="only bulk configs that hold their tile as fp32 (codegen.holds_fp32_tile)"
                    " and not in the base (--base-tile-max)")
    ap.add_argument("--base-tile-max", type=int, default=codegen.FP32_TILE_MAX,
                    help="the base's codegen.FP32_TILE_MAX (0: a tree from before the fp32 tile)")
    ap.add_argument("--stats", default="",
                    help="time these statistics instead: each picked config with stats replaced"
                    " (e.g. welford; the bulk kernel has two-pass only, so bulk configs drop out)")
    args = ap.parse_args()
    t0 = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(Path(__file__).parents[2] / "tuning_db" / "autonorm.db")
    shapes = SHAPES
    if args.only:
        want = {(d, int(h)) for d, h in (s.split(":") for s in args.only.split(","))}
        shapes = [s for s in SHAPES if s in want]
    plan = {}
    for dtype, hidden in shapes:
        if args.ftile:
            every = top_configs(db, dtype, hidden, 10_000, "bulk")
            # the shape's winner first, as the bar the fp32-tile configs must clear
            winner = top_configs(db, dtype, hidden, 1)
            problem = Problem(hidden, dtype)
            plan[dtype, hidden] = winner + [
                c for c in every
                if codegen.holds_fp32_tile(c, problem) and c not in winner
                and derive_shape(c, problem).iters * c.vec > args.base_tile_max
            ][:args.top]
        else:
            plan[dtype, hidden] = top_configs(db, dtype, hidden, args.top, args.cache)
        if args.stats:
            problem = Problem(hidden, dtype)
            swapped = [dataclasses.replace(c, stats=args.stats) for c in
                       top_configs(db, dtype, hidden, 10_000, args.cache) if c.cache != "bulk"]
            plan[dtype, hidden] = list(dict.fromkeys(
                c for c in swapped if space.is_valid(c, problem)))[:args.top]
    pool = compiler.CompilePool()
    records = []
    for (dtype, hidden), configs in plan.items():
        if time.time() - t0 > args.budget_s:
            print("budget spent", flush=True)
            break
        problem = Problem(hidden, dtype)
        rows = (1 << 26) // hidden
        new = BaseEvaluator(problem, rows, pool=pool)
        new.base_dir = Path(args.new).resolve() if args.new else None
        base = BaseEvaluator(problem, rows, pool=pool)
        base.base_dir = Path(args.base).resolve()
        base.base_tile_max = args.base_tile_max
        new.prepare(configs)
        base.prepare(configs)
        ratios = []
        for config in configs:
            ob, on = base.evaluate(config), new.evaluate(config)
            base_note = ""
            if ob.status == "verification" and on.status == "ok":
                # A base the change fixes (it fails a verification case the new one passes):
                # say which case, and still time it for the cost of the fix.
                print(f"  {dtype:8s} {hidden:6d} {config.label():44s} base FAILS "
                      f"{(ob.error or '')[:200]}", flush=True)
                base_note = "base failed verification"
            elif ob.status != "ok" or on.status != "ok":
                print(f"  {dtype:8s} {hidden:6d} {config.label():44s} base {ob.status} new "
                      f"{on.status} {(ob.error or on.error or '')[:160]}", flush=True)
                records.append(dict(dtype=dtype, hidden=hidden, config=config.to_dict(),
                                    base=ob.status, new=on.status))
                continue
            tb, tn = [], []
            for _ in range(args.rounds):
                tb.append(base.time(config, samples=10).median_us)
                tn.append(new.time(config, samples=10).median_us)
            mb, mn = statistics.median(tb), statistics.median(tn)
            share_b = base.nbytes / (mb * 1e-6) / 1e9 / base.copy_gbps
            share_n = new.nbytes / (mn * 1e-6) / 1e9 / base.copy_gbps
            ratios.append(mb / mn)
            records.append(dict(dtype=dtype, hidden=hidden, config=config.to_dict(),
                                base_us=mb, new_us=mn, base_share=share_b, new_share=share_n,
                                base_err=ob.max_rel_err, new_err=on.max_rel_err,
                                note=base_note))
            print(f"  {dtype:8s} {hidden:6d} {config.label():44s} base {share_b*100:5.1f}% "
                  f"new {share_n*100:5.1f}% x{mb/mn:.3f} err {ob.max_rel_err:.1e}/"
                  f"{on.max_rel_err:.1e} {base_note}", flush=True)
        if ratios:
            best_b = max(r["base_share"] for r in records
                         if r["dtype"] == dtype and r["hidden"] == hidden and "base_share" in r)
            best_n = max(r["new_share"] for r in records
                         if r["dtype"] == dtype and r["hidden"] == hidden and "new_share" in r)
            print(f"SHAPE {dtype} {hidden}: best base {best_b*100:.1f}% best new {best_n*100:.1f}%"
                  f" mean x{statistics.mean(ratios):.3f}", flush=True)
        json.dump(dict(copy_gbps=new.copy_gbps, records=records),
                  open(out / "ab_lab.json", "w"), indent=1)
        del new, base
        import cupy

        cupy.get_default_memory_pool().free_all_blocks()
    pool.close()


if __name__ == "__main__":
    main()
