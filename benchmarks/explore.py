"""Speed exploration on the GPU: verify and time a sample of configurations per shape.

Run on the GPU machine:  python benchmarks/explore.py --out $OUT
Prints a table of the best configurations per (dtype, hidden) at 2^26 elements and writes every
measurement to explore.json.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from autonorm.dtypes import normalize_dtype
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.space import default_config, enumerate_space
from autonorm.runtime.compiler import CompilePool
from autonorm.runtime.device import query_device
from autonorm.tune.evaluator import GpuEvaluator


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtypes", default="bf16,fp32")
    parser.add_argument("--hidden", default="768,1024,2048,4096,8192,16384,32768,65536")
    parser.add_argument("--per-shape", type=int, default=16)
    parser.add_argument("--elements", type=int, default=1 << 26)
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--configs", default="", help="JSON list of config dicts to add")
    parser.add_argument("--focus", default="", help="only sample configs with these fields, "
                        "e.g. cache=registers,vec=max,cluster=1")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info = query_device()
    limits = info.limits()
    pool = CompilePool()
    extra = json.loads(args.configs) if args.configs else []
    records = []
    for dtype in args.dtypes.split(","):
        for hidden in map(int, args.hidden.split(",")):
            problem = Problem(hidden, normalize_dtype(dtype))
            rows = args.elements // hidden
            space = enumerate_space(problem, limits)
            for item in filter(None, args.focus.split(",")):
                field, value = item.split("=")
                want = problem.max_vec if value == "max" else value
                space = [c for c in space if str(getattr(c, field)) == str(want)
                         or (field == "blocks_per_sm" and value == "persistent"
                             and c.blocks_per_sm > 0)]
            rng = random.Random(hidden)
            cands = [default_config(problem, limits)] + rng.sample(
                space, min(args.per_shape, len(space))
            )
            from autonorm.ops.layer_norm.config import KernelConfig
            from autonorm.ops.layer_norm.rules import check

            for d in extra:
                c = KernelConfig.from_dict(d)
                if not check(c, problem, limits):
                    cands.append(c)
            t0 = time.time()
            ev = GpuEvaluator(problem, rows, pool=pool)
            ev.prepare(cands)
            for c in cands:
                o = ev.evaluate(c)
                rec = {"dtype": problem.dtype, "hidden": hidden, "rows": rows,
                       "config": c.to_dict(), "label": c.label(), "status": o.status,
                       "error": o.error, "max_rel_err": o.max_rel_err}
                if o.timing:
                    rec.update(us=o.timing.median_us, gbps=o.timing.gbps, share=o.timing.share,
                               cv=o.timing.cv)
                records.append(rec)
            ok = sorted((r for r in records if r["dtype"] == problem.dtype and
                         r["hidden"] == hidden and r["status"] == "ok"), key=lambda r: r["us"])
            fails = [r for r in records if r["dtype"] == problem.dtype and r["hidden"] == hidden
                     and r["status"] != "ok"]
            print(f"{problem.dtype:9s} {hidden:6d} copy={ev.copy_gbps:.0f}GB/s "
                  f"{time.time() - t0:5.1f}s fails={len(fails)}", flush=True)
            for r in ok[:4]:
                print(f"    {r['share'] * 100:5.1f}%  {r['gbps']:7.0f} GB/s {r['us']:8.1f}us "
                      f"cv={r['cv']:.3f} err={r['max_rel_err']:.1e} {r['label']}", flush=True)
            for r in fails[:3]:
                print(f"    FAIL {r['status']}: {r['label']}: {(r['error'] or '')[:200]}")
            (out / "explore.json").write_text(json.dumps(records, indent=1))
            del ev
    pool.close()
    sys.exit(0)


if __name__ == "__main__":
    main()
