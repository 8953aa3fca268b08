"""Should the untuned 16-bit default take the 64-register cap? Default vs capped variants, on the GPU.

Run on the GPU machine from the repo root:

    python benchmarks/lab/default_cap_lab.py --out $OUT

For each 16-bit hidden size (rows = 2^26 / hidden) it takes ``space.default_config`` and the
capped variants ``space.check`` admits: the same config with ``max_regs=64``, the same shape with a
shared-memory cache, and a register cache with twice the threads per row (half the vectors per
thread, the register caches the cap holds). All are verified against float64 and timed through
the product's evaluator, then re-timed interleaved (``GpuEvaluator.retime``). Prints one line per
variant (share of copy, ratio to the default) and writes ``$OUT/default_cap_lab.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from autonorm import compiler
from autonorm.device import query_device
from autonorm.evaluator import GpuEvaluator
from autonorm.space import Problem, check, default_config

HIDDEN = (768, 1000, 1536, 2048, 2560, 4096, 5120, 6144, 8192, 11008, 14336, 16384)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="bfloat16,float16")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", default="/tmp/out")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    limits = query_device().limits()
    pool = compiler.CompilePool()
    records = []
    for dtype in args.dtypes.split(","):
        for hidden in HIDDEN:
            problem = Problem(hidden, dtype)
            base = default_config(problem, limits)
            wide = dataclasses.replace(base, threads=min(1024, base.threads * 2))
            if wide.threads == base.threads:  # 1024 threads already: halve rows per block
                wide = dataclasses.replace(base, rows_per_block=max(1, base.rows_per_block // 2))
            variants = {
                "capped": dataclasses.replace(base, max_regs=64),
                "smem-capped": dataclasses.replace(base, cache="smem", max_regs=64),
                "wide-capped": dataclasses.replace(wide, max_regs=64),
            }
            ok = {k: c for k, c in variants.items() if not check(c, problem, limits)}
            ev = GpuEvaluator(problem, (1 << 26) // hidden, pool=pool)
            ev.prepare([base, *ok.values()])
            outcomes = {"default": ev.evaluate(base)} | {k: ev.evaluate(c) for k, c in ok.items()}
            timed = [k for k, o in outcomes.items() if o.status == "ok"]
            configs = {"default": base} | ok
            for k, o in outcomes.items():
                if o.status != "ok":
                    print(f"{dtype:9s} {hidden:6d} {k:12s} {configs[k].label():38s} {o.status} "
                          f"{(o.error or '')[:120]}", flush=True)
            timings = dict(zip(timed, ev.retime([configs[k] for k in timed], args.rounds),
                               strict=True))
            ref = timings.get("default")
            for k, t in timings.items():
                ratio = ref.median_us / t.median_us if ref else None
                print(f"{dtype:9s} {hidden:6d} {k:12s} {configs[k].label():38s} "
                      f"{t.share * 100:5.1f}% x{ratio or 0:.3f} err "
                      f"{outcomes[k].max_rel_err:.1e}", flush=True)
                records.append({"dtype": dtype, "hidden": hidden, "variant": k,
                                "config": configs[k].to_dict(), "share": t.share,
                                "vs_default": ratio, "max_rel_err": outcomes[k].max_rel_err})
            for k in variants:
                if k not in ok:
                    records.append({"dtype": dtype, "hidden": hidden, "variant": k,
                                    "config": variants[k].to_dict(), "status": "invalid"})
            (out / "default_cap_lab.json").write_text(json.dumps(records, indent=1))
            del ev
    pool.close()


if __name__ == "__main__":
    main()
