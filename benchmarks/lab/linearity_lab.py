"""Lab only: is the wide shapes' gap to copy a fixed cost per launch or a steady-state rate?

tail_lab.py found no cost in a partly filled last round. Here each shipped winner is timed at
0.5, 1, 2 and 4 times the peers' rows (single launches after an L2 flush, interleaved), and so
is a copy of the same bytes; a least-squares line T = fixed + rows x per_row for each says
whether autonorm loses its points in a fixed cost (the first tile must arrive whole before any
store, the last stores drain alone) or in the rate at which rows stream once it runs.

Run on the GPU machine: ``python benchmarks/lab/linearity_lab.py --out $OUT``.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import lab_eval

from autonorm import dispatch
from autonorm.space import Problem

# Each shape's kernel is the one dispatch picks at the peers' rows (the shipped winner on an
# H200); session 13 timed its own list of that day's winners.
SHAPES = (
    ("bfloat16", 65536), ("bfloat16", 32768), ("bfloat16", 16384), ("bfloat16", 12288),
    ("float16", 16384), ("float32", 65536), ("float32", 12288), ("bfloat16", 4096),
)
SCALES = (0.5, 1, 2, 4)


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares line through (xs, ys): (intercept, slope)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def main() -> None:
    args = lab_eval.lab_arguments(offline=False).parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records = []
    for dtype, hidden in SHAPES:
        problem = Problem(hidden, dtype)
        base = (1 << 26) // hidden
        config = dispatch.choose_config(problem, base).config
        label = config.label()
        timed = lab_eval.time_at_rows(problem, config, [int(base * k) for k in SCALES],
                                      args.rounds)
        xs, ln, cp = [], [], []
        for r, (ev, ts) in timed.items():
            us = statistics.median(t.median_us for t in ts)
            copy_us = ev.nbytes / (statistics.median(t.copy_gbps for t in ts) * 1e9) * 1e6
            xs.append(r)
            ln.append(us)
            cp.append(copy_us)
            print(f"{dtype:8s} {hidden:6d} {label:34s} rows {r:6d} {us:8.2f} us copy "
                  f"{copy_us:8.2f} us share {copy_us / us * 100:5.1f}%", flush=True)
        (a_ln, b_ln), (a_cp, b_cp) = fit(xs, ln), fit(xs, cp)
        print(f"{dtype:8s} {hidden:6d} fit: autonorm {a_ln:6.2f} us + {b_ln * 1e3:7.2f} ns/row, "
              f"copy {a_cp:6.2f} us + {b_cp * 1e3:7.2f} ns/row; per-row share "
              f"{b_cp / b_ln * 100:5.1f}%, at the peers' rows the fixed costs take "
              f"{(a_ln - a_cp) / (a_ln + b_ln * base) * 100:4.1f} points", flush=True)
        records.append(dict(dtype=dtype, hidden=hidden, label=label, rows=xs, us=ln,
                            copy_us=cp, fixed_us=a_ln, per_row_ns=b_ln * 1e3,
                            copy_fixed_us=a_cp, copy_per_row_ns=b_cp * 1e3))
        json.dump(records, open(out / "linearity_lab.json", "w"), indent=1)
        del timed
        lab_eval.free_gpu_memory()


if __name__ == "__main__":
    main()
