"""Lab only (session 23): settle a shipped winner kept by merge_db's margin, head to head.

merge_db keeps the shipped winner unless a search's finals measure a challenger more than one
point of copy bandwidth faster: one search's edge under a point is noise (NOTES.md 48). Where a
second, independent measurement put the challenger ahead in every interleaved round (session 23,
``delay_lab.log``: fp16 32768 x1.005-1.020 in 18 of 18 rounds, bf16/fp16 16384 x1.000-1.017 in
18 of 18), this re-times both with the tuner's own finals (``GpuEvaluator.retime``, single
launches after an L2 flush, share of a same-bytes copy timed that way), verifying both first,
and stores the challenger with that timing when it is faster there too.

    python benchmarks/lab/promote_lab.py DB float16:32768=LABEL ... --rounds 15   # GPU machine
"""

from __future__ import annotations

import argparse

from autonorm import codegen
from autonorm.db import TuningDB, TuningKey
from autonorm.device import query_device
from autonorm.evaluator import GpuEvaluator
from autonorm.space import KernelConfig, Problem


def promote(db: TuningDB, spec: str, rounds: int) -> None:
    """Re-time ``spec``'s (DTYPE:HIDDEN=LABEL) shipped winner and challenger; store the faster."""
    shape, label = spec.split("=")
    dtype, hidden = shape.split(":")
    problem = Problem(int(hidden), dtype)
    rows = (1 << 26) // problem.hidden
    key = TuningKey.for_problem(query_device().fingerprint, codegen.code_version(), problem, rows)
    shipped = db.get_winner(key)
    if shipped is None:
        raise SystemExit(f"{shape}: no shipped winner under {key}")
    incumbent = KernelConfig.from_dict(shipped.config)
    challenger = KernelConfig.from_label(label)
    ev = GpuEvaluator(problem, rows)
    for c in (incumbent, challenger):
        o = ev.evaluate(c)
        if o.status != "ok":
            raise SystemExit(f"{shape} {c.label()}: {o.status}: {o.error}")
    t_inc, t_ch = ev.retime([incumbent, challenger], rounds)
    print(f"{shape}: shipped {incumbent.label()} {t_inc.median_us:.2f} us "
          f"{t_inc.share * 100:.1f}% | challenger {challenger.label()} {t_ch.median_us:.2f} us "
          f"{t_ch.share * 100:.1f}% | x{t_inc.median_us / t_ch.median_us:.3f}", flush=True)
    if t_ch.median_us < t_inc.median_us:
        metrics = t_ch.metrics(rows=rows, trials=shipped.metrics.get("trials"),
                               copy_gbps=t_ch.copy_gbps, settled="head-to-head, session 23")
        db.set_winner(key, challenger.to_dict(), metrics)
        print(f"{shape}: challenger stored", flush=True)
    else:
        print(f"{shape}: shipped winner kept", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("db")
    ap.add_argument("specs", nargs="+", help="DTYPE:HIDDEN=LABEL")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    with TuningDB(args.db) as db:
        for spec in args.specs:
            promote(db, spec, args.rounds)


if __name__ == "__main__":
    main()
