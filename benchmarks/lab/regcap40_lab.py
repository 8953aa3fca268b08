"""Lab only: a 40-register cap for the cp.async-filled smem winners (6 blocks of 256 per SM).

ncu at bf16 16384 (session 8, call H): our t256v8r1-smem-m64 runs 4 blocks per SM (64 registers,
44.8% achieved occupancy, 1.31 eligible warps per scheduler), torch.compile's kernel 31
registers and 83.7%. With the cp.async fill, ptxas fits the shipped t256 smem winners in 40
registers without spills (nvcc 13.0). This adds 40 to ``space.MAX_REGS`` in this process only,
verifies both caps through the product's evaluator and re-times them interleaved.

Run from the repo root on the GPU machine: ``python benchmarks/lab/regcap40_lab.py --out $OUT``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from autonorm import compiler, space
from autonorm.evaluator import GpuEvaluator
from autonorm.space import KernelConfig, Problem

SHAPES = (
    ("bfloat16", 16384, "t256v8r1-smem-two_pass-c1-p0-m64"),
    ("float16", 16384, "t256v8r1-smem-two_pass-c1-p0-m64"),
    ("bfloat16", 12288, "t256v8r1-smem-two_pass-c1-p0-m64"),
    ("float16", 12288, "t256v8r1-smem-two_pass-c1-p0-m64"),
    ("bfloat16", 8192, "t256v8r1-smem-two_pass-c1-p0-m64"),
    ("bfloat16", 4096, "t256v8r2-smem-two_pass-c1-p0-m64"),
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="/tmp/out")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    space.MAX_REGS = (0, 40, 64)  # this process only
    pool = compiler.CompilePool()
    records = []
    for dtype, hidden, label in SHAPES:
        problem = Problem(hidden, dtype)
        base = KernelConfig.from_label(label)
        capped = dataclasses.replace(base, max_regs=40)
        why = space.check(capped, problem)
        if why:
            print(f"{dtype} {hidden} {capped.label()}: invalid: {why}", flush=True)
            continue
        ev = GpuEvaluator(problem, (1 << 26) // hidden, pool=pool)
        ev.prepare([base, capped])
        outcomes = [ev.evaluate(c) for c in (base, capped)]
        if any(o.status != "ok" for o in outcomes):
            print(f"{dtype} {hidden}: {[(o.status, o.error) for o in outcomes]}", flush=True)
            continue
        tb, tc = ev.retime([base, capped], args.rounds)
        regs = [ev._compile(c).attributes.get("num_regs") for c in (base, capped)]  # noqa: SLF001
        print(f"{dtype:8s} {hidden:6d} {label:36s} m64 {tb.share * 100:5.1f}% {tb.median_us:6.1f} us"
              f" ({regs[0]} regs)  m40 {tc.share * 100:5.1f}% {tc.median_us:6.1f} us ({regs[1]} "
              f"regs)  x{tb.median_us / tc.median_us:.3f}  err {outcomes[1].max_rel_err:.1e}",
              flush=True)
        records.append({"dtype": dtype, "hidden": hidden, "label": label, "m64_us": tb.median_us,
                        "m40_us": tc.median_us, "m64_share": tb.share, "m40_share": tc.share,
                        "regs": regs})
        (out / "regcap40_lab.json").write_text(json.dumps(records, indent=1))
        del ev
    pool.close()


if __name__ == "__main__":
    main()
