"""Lab only (session 23): settle a shipped winner against challengers head to head.

merge_db keeps the shipped winner unless a search's finals measure a challenger more than one
point of copy bandwidth faster: one search's edge under a point is noise (NOTES.md 48). Where a
second, independent measurement put the challenger ahead in every interleaved round (session 23,
``delay_lab.log``: fp16 32768 x1.005-1.020 in 18 of 18 rounds, bf16/fp16 16384 x1.000-1.017 in
18 of 18), or where the search never timed a config that measured well at a neighbouring shape,
this times the shipped winner and the challengers with the tuner's own finals
(``GpuEvaluator.retime``: single launches after an L2 flush, share of a same-bytes copy timed
that way), verifying each first. The fastest challenger, if ahead of the winner by
``--min-gain``, is re-timed against it once more (picking the fastest of several favours a lucky
run) and stored with that second timing if it is ahead by as much there too. Call s23g's fp16
1024 challenger came out x1.000 and x1.001, and was stored before the floor existed; its edge is
no evidence, and the shipped winner was put back by hand.

    python benchmarks/lab/promote_lab.py DB DTYPE:HIDDEN[@ROWS]=LABEL[,LABEL...] ... --rounds 15
"""

from __future__ import annotations

import argparse
import dataclasses

from autonorm import codegen, space
from autonorm.db import TuningDB, TuningKey
from autonorm.device import query_device
from autonorm.evaluator import GpuEvaluator
from autonorm.space import KernelConfig, Problem


def promote(db: TuningDB, spec: str, rounds: int, min_gain: float, note: str,
            dry_run: bool = False) -> None:
    """Settle ``spec``'s shipped winner against its challengers; store a challenger that wins."""
    shape, labels = spec.split("=")
    dtype_hidden, _, rows_text = shape.partition("@")
    dtype, hidden = dtype_hidden.split(":")
    problem = Problem(int(hidden), dtype)
    rows = int(rows_text) if rows_text else (1 << 26) // problem.hidden
    key = TuningKey.for_problem(query_device().fingerprint, codegen.code_version(), problem, rows)
    shipped = db.get_winner(key)
    if shipped is None:
        raise SystemExit(f"{shape}: no shipped winner under {key}")
    incumbent = KernelConfig.from_dict(shipped.config)
    ev = GpuEvaluator(problem, rows)
    challengers = []
    for c in [incumbent] + [KernelConfig.from_label(lb) for lb in labels.split(",")]:
        o = ev.evaluate(c)
        if o.status != "ok":
            print(f"{shape} {c.label()}: {o.status}: {(o.error or '')[:200]}", flush=True)
            if c == incumbent:
                raise SystemExit(f"{shape}: the shipped winner failed")
        elif c != incumbent:
            challengers.append(c)
    if not challengers:
        print(f"{shape}: no challenger verified; shipped winner kept", flush=True)
        return
    timings = ev.retime([incumbent] + challengers, rounds)
    t_inc = timings[0]
    for c, t in zip([incumbent] + challengers, timings, strict=True):
        print(f"{shape}: {'shipped   ' if c == incumbent else 'challenger'} {c.label():40s} "
              f"{t.median_us:8.2f} us {t.share * 100:5.1f}% x{t_inc.median_us / t.median_us:.3f}",
              flush=True)
    best, t_best = min(zip(challengers, timings[1:], strict=True), key=lambda p: p[1].median_us)
    if t_inc.median_us / t_best.median_us < 1 + min_gain:
        print(f"{shape}: shipped winner kept", flush=True)
        return
    t_inc, t_best = ev.retime([incumbent, best], rounds)
    print(f"{shape}: again, shipped {t_inc.median_us:.2f} us against {best.label()} "
          f"{t_best.median_us:.2f} us {t_best.share * 100:.1f}% "
          f"x{t_inc.median_us / t_best.median_us:.3f}", flush=True)
    if dry_run:
        print(f"{shape}: dry run, nothing stored", flush=True)
    elif t_inc.median_us / t_best.median_us >= 1 + min_gain:
        metrics = t_best.metrics(rows=rows, trials=shipped.metrics.get("trials"),
                                 copy_gbps=t_best.copy_gbps, settled=f"head-to-head, {note}")
        db.set_winner(key, best.to_dict(), metrics)
        print(f"{shape}: challenger stored", flush=True)
    else:
        print(f"{shape}: shipped winner kept", flush=True)


def keep_x_twin_specs(db: TuningDB, device: str, version: str,
                      caches: tuple[str, ...] = ("bulk",)) -> list[str]:
    """A spec for every winner of ``device`` and ``version`` without keep_x whose kernel holds
    its row in one of ``caches``: its ``-k`` twin.

    The rows are those the winner was timed at (its metrics), else its bucket. Winners of a
    problem without weight or bias are left out (a spec names the affine problem).
    """
    specs = []
    for w in db.winners(device):
        cfg = KernelConfig.from_dict(w.config)
        k = w.key
        if (k.version != version or cfg.cache not in caches or cfg.keep_x
                or not (k.has_weight and k.has_bias)):
            continue
        rows = int(w.metrics.get("rows") or k.rows_bucket)
        twin = dataclasses.replace(cfg, keep_x=True)
        specs.append(f"{k.dtype}:{k.hidden}@{rows}={twin.label()}")
    return specs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("db")
    ap.add_argument("specs", nargs="*", help="DTYPE:HIDDEN[@ROWS]=LABEL[,LABEL...]")
    ap.add_argument("--keep-x-twins", action="store_true",
                    help="also set every winner of this GPU and version without keep_x "
                         "against its -k twin (session 24, NOTES.md 119)")
    ap.add_argument("--twin-caches", default="bulk",
                    help="the winners --keep-x-twins takes, by row cache, comma-separated "
                         "(session 25: registers,smem,none)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--min-gain", type=float, default=0.003,
                    help="the challenger's least speed-up over the winner, in both re-times")
    ap.add_argument("--note", default="promote_lab",
                    help="where the settlement was made, stored in the winner's metrics")
    ap.add_argument("--dry-run", action="store_true", help="time and report; store nothing")
    ap.add_argument("--bulk-max-iters", type=int, default=0,
                    help="admit bulk configs of up to this many vectors a thread (lab only: "
                         "implies --dry-run, the product's space stays as it is)")
    args = ap.parse_args()
    if args.bulk_max_iters:
        space.BULK_MAX_ITERS = args.bulk_max_iters
        args.dry_run = True
    with TuningDB(args.db) as db:
        specs = list(args.specs)
        if args.keep_x_twins:
            specs += keep_x_twin_specs(db, query_device().fingerprint, codegen.code_version(),
                                       tuple(args.twin_caches.split(",")))
        for spec in specs:
            promote(db, spec, args.rounds, args.min_gain, args.note, args.dry_run)


if __name__ == "__main__":
    main()
