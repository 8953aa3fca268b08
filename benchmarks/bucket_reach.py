#!/usr/bin/env python3
"""How far a tuned rows bucket's winner serves other row counts, against the default rule.

Run on a GPU machine, from the repository root::

    python benchmarks/bucket_reach.py --json $OUT/reach.json       # ~2 min on an H200
    python benchmarks/bucket_reach.py --ops add_rms_norm,add_layer_norm --hidden 490,768,1024 \\
        --rows 1,8,64,256
    python benchmarks/bucket_reach.py --plan                        # the cases (no GPU)

For each op, dtype, hidden size and row count whose rows bucket the shipped database does not
hold, it times two kernels by CUDA-graph replay (median of ``--rounds`` interleaved rounds),
both through ``autonorm.torch``: the winner of the nearest bucket the shipped database holds
for that problem, however far (what lookup lent before ``autonorm.lookup.NEAREST_MAX_OCTAVES``
bounded it), and the family's default for the row count. Where they are the same configuration
the case is left out. Each output is checked against float64 before it is timed. The summary
gives, by the octaves between the two buckets, the geometric mean of the winner's time over the
default's: above 1, the default is faster (docs/tuning.md, lookup).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

OPS = ("rms_norm", "add_rms_norm", "layer_norm", "add_layer_norm")
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
HIDDEN = (1024, 2048, 4096, 8192, 16384, 32768)
ROWS = (1, 8, 64, 512, 2048, 8192)
EPS = 1e-5
TOLERANCE = {"float32": 1e-5, "float16": 1e-2, "bfloat16": 2e-2}


@dataclass(frozen=True)
class Case:
    """A shape and the two configurations timed at it."""

    op: str
    dtype: str
    hidden: int
    rows: int
    octaves: float  # between the winner's bucket and this row count's
    nearest: object  # the configuration of the nearest tuned bucket
    default: object  # the family's default for the row count


def problem_of(op: str, hidden: int, dtype: str):  # noqa: ANN201
    """The family problem of a benchmark op (``add_*``: with the residual add)."""
    from autonorm.ops import registry

    family = registry.get(op.removeprefix("add_"))
    return family.problem(hidden=hidden, dtype=dtype, residual=op.startswith("add_"))


def build_cases(ops, dtypes, hiddens, rows, device, shipped) -> list[Case]:  # noqa: ANN001
    """The cases the shipped database lends to from another bucket, with both picks."""
    from autonorm.lookup import choose
    from autonorm.ops.base import rows_bucket
    from autonorm.ops.registry import family_of

    cases = []
    for hidden in hiddens:
        for count in rows:
            for dtype in dtypes:
                for op in ops:
                    problem = problem_of(op, hidden, dtype)
                    ranked = [w for w in shipped.winners_by_distance(
                        _key(device, problem, count)) if w.key.rows_bucket != rows_bucket(count)]
                    if not ranked or choose(problem, count, device, [shipped]).source == "shipped":
                        continue
                    winner = ranked[0]
                    default = family_of(problem).default(problem, device.limits, count)
                    nearest = family_of(problem).config_from_dict(winner.config)
                    if nearest == default:
                        continue
                    octaves = abs(math.log2(winner.key.rows_bucket) - math.log2(rows_bucket(count)))
                    cases.append(Case(op, dtype, hidden, count, octaves, nearest, default))
    return cases


def _key(device, problem, count):  # noqa: ANN001, ANN202
    from autonorm.store.keys import TuningKey

    return TuningKey.for_problem(device.fingerprint, problem, count)


def summarize(records: list[dict]) -> list[tuple[float, int, float, float, float]]:
    """(octaves, cases, geometric mean, min, max) of nearest/default time, by octaves."""
    by: dict[float, list[float]] = {}
    for rec in records:
        by.setdefault(rec["octaves"], []).append(rec["nearest_us"] / rec["default_us"])
    return [(octaves, len(v), math.exp(sum(map(math.log, v)) / len(v)), min(v), max(v))
            for octaves, v in sorted(by.items())]


def format_summary(records: list[dict]) -> str:
    lines = ["octaves  cases  nearest/default (geo)  min    max",
             "-------  -----  ---------------------  -----  -----"]
    for octaves, n, geo, lo, hi in summarize(records):
        lines.append(f"{octaves:7.0f}  {n:5d}  {geo:21.3f}  {lo:5.2f}  {hi:5.2f}")
    return "\n".join(lines)


def _int_list(text: str) -> list[int]:
    try:
        values = [int(t) for t in text.split(",") if t.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError("give positive integers, e.g. 1,8,64")
    return values


def _names(text: str, allowed) -> list[str]:  # noqa: ANN001
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        given = ", ".join(bad) if bad else repr(text)
        raise argparse.ArgumentTypeError(f"{given}: one of {', '.join(allowed)}")
    return names


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", type=lambda s: _names(s, OPS), default=list(OPS),
                   help="comma-separated: " + ", ".join(OPS) + " (default all)")
    p.add_argument("--dtypes", type=lambda s: _names(s, tuple(DTYPES)), default=["bf16", "fp32"],
                   help="bf16, fp16, fp32 (default bf16,fp32)")
    p.add_argument("--hidden", type=_int_list, default=list(HIDDEN),
                   help="hidden sizes (default " + ",".join(map(str, HIDDEN)) + ")")
    p.add_argument("--rows", type=_int_list, default=list(ROWS),
                   help="row counts (default " + ",".join(map(str, ROWS)) + ")")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--json", type=Path, default=None, help="write every number here")
    p.add_argument("--plan", action="store_true", help="list the cases for an H200, no GPU")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    dtypes = [DTYPES[d] for d in args.dtypes]
    from autonorm import lookup
    from autonorm.store.db import TuningDB

    shipped = TuningDB.open_shipped()
    if shipped is None:
        print("bucket_reach.py: no shipped database (AUTONORM_NO_SHIPPED_DB?)", file=sys.stderr)
        return 2
    if args.plan:
        from autonorm.runtime.device import DeviceInfo

        info = DeviceInfo("NVIDIA H200", 90, 132, 62914560, 232448, 6016, 3201000)
    else:
        from peerbench.gpu import require_gpu

        from autonorm.runtime.device import query_device

        require_gpu("bucket_reach.py", torch=True)
        info = query_device(0)
    device = lookup.Device(info.fingerprint, info.limits())
    cases = build_cases(args.ops, dtypes, args.hidden, args.rows, device, shipped)
    if args.plan:
        for c in cases:
            print(f"{c.op:14s} {c.dtype:8s} {c.hidden:6d} rows {c.rows:5d} {c.octaves:3.0f} "
                  f"octaves: {c.nearest.label()} | {c.default.label()}")
        print(f"{len(cases)} cases")
        return 0
    records = measure(cases, args.rounds, info)
    print(format_summary(records))
    if args.json is not None:
        args.json.write_text(json.dumps({"device": info.fingerprint, "records": records}, indent=1))
    return 0


def measure(cases: list[Case], rounds: int, info) -> list[dict]:  # noqa: ANN001
    """Time both picks of each case through autonorm.torch, checked against float64 first."""
    import torch
    from peerbench.timing import graph_ms

    import autonorm.torch as ant
    from autonorm import dispatch, lookup
    from autonorm.ops.registry import family_of
    from autonorm.runtime import compiler
    from autonorm.torch import forward

    caches = (forward._KERNELS, forward._RMS_KERNELS, forward._ADD_RMS_KERNELS,
              forward._ADD_LN_KERNELS)
    pool = compiler.CompilePool(max(1, min(15, (os.cpu_count() or 2) - 1)))
    for c in cases:  # compile everything first, in parallel
        problem = problem_of(c.op, c.hidden, c.dtype)
        for config in (c.nearest, c.default):
            pool.submit(family_of(problem).render(config, problem, info.limits()), info.arch)
    real_choose, records = lookup.choose, []
    try:
        for c in cases:
            torch.manual_seed(c.hidden + c.rows)
            tdt = getattr(torch, c.dtype)
            x = torch.randn(c.rows, c.hidden, device="cuda", dtype=tdt)
            res = torch.randn(c.rows, c.hidden, device="cuda", dtype=tdt)
            w = (1 + 0.1 * torch.randn(c.hidden, device="cuda")).to(tdt)
            b = (0.1 * torch.randn(c.hidden, device="cuda")).to(tdt)
            call = _call(ant, c.op, x, res, w, b)
            h = (x.float() + res.float()).to(tdt).double() if c.op.startswith("add_") \
                else x.double()
            if "rms" in c.op:
                ref = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS) * w.double()
            else:
                ref = torch.nn.functional.layer_norm(h, (c.hidden,), w.double(), b.double(), EPS)
            kept = {}
            for name, config in (("nearest", c.nearest), ("default", c.default)):
                choice = lookup.Choice(config, name)
                lookup.choose = lambda *a, choice=choice, **k: choice
                dispatch.clear_cache()
                ant.clear_kernel_cache()
                err = ((call().double() - ref).abs().max() / ref.abs().max()).item()
                if not err <= TOLERANCE[c.dtype]:
                    raise SystemExit(f"{c.op} {c.dtype} {c.hidden} x {c.rows}: {name} "
                                     f"{config.label()} is off float64 by {err:.2e}")
                kept[name] = [dict(cache) for cache in caches]
            lookup.choose = real_choose
            times: dict[str, list[float]] = {"nearest": [], "default": []}
            for _ in range(rounds):
                for name in times:
                    for cache, snapshot in zip(caches, kept[name], strict=True):
                        cache.clear()
                        cache.update(snapshot)
                    times[name].append(graph_ms(call, rep_ms=5)[0] * 1e3)
            rec = {"op": c.op, "dtype": c.dtype, "hidden": c.hidden, "rows": c.rows,
                   "octaves": c.octaves, "nearest": c.nearest.label(),
                   "default": c.default.label(),
                   **{f"{n}_us": statistics.median(v) for n, v in times.items()}}
            records.append(rec)
            print(f"{c.op:14s} {c.dtype:8s} {c.hidden:6d} rows {c.rows:5d} {c.octaves:3.0f} oct "
                  f"nearest {rec['nearest_us']:8.2f} us default {rec['default_us']:8.2f} us "
                  f"({rec['nearest_us'] / rec['default_us']:.2f})", flush=True)
    finally:
        lookup.choose = real_choose
        pool.close()
    return records


def _call(ant, op: str, x, res, w, b):  # noqa: ANN001, ANN202
    """A callable running ``op`` through ``autonorm.torch`` on these tensors; y comes back."""
    return {"layer_norm": lambda: ant.layer_norm(x, w, b, EPS),
            "rms_norm": lambda: ant.rms_norm(x, w, EPS),
            "add_rms_norm": lambda: ant.add_rms_norm(x, res, w, EPS)[0],
            "add_layer_norm": lambda: ant.add_layer_norm(x, res, w, b, EPS)[0]}[op]


if __name__ == "__main__":
    sys.exit(main())
