"""Lab only: does the last, partly filled round of rows cost the wide shapes their share?

The bulk winners at 32768 and 65536 hold one block per SM and work a whole row per block (or per
cluster): bf16 32768 has 2048 rows for 132 blocks (15.5 rounds), bf16 65536 1024 rows for 66
clusters of 2 (15.5), fp32 65536 1024 rows for 33 clusters of 4 (31.03). If an SM cannot pull
more than its share of DRAM bandwidth, the last round runs at the active SMs' fraction of it, and
a row count that fills every round would read a higher share of copy than the peers' 2^26
elements. Each shipped winner is timed at the peers' rows and at the two neighbouring whole
numbers of rounds, single launches after an L2 flush, share of a same-bytes copy, interleaved.

Run on the GPU machine: ``python benchmarks/lab/tail_lab.py --out $OUT``.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import lab_eval

from autonorm import codegen
from autonorm.space import KernelConfig, Problem

SHAPES = (
    ("bfloat16", 32768, "t512v8r1-bulk-two_pass-c1-p0-s2"),
    ("bfloat16", 65536, "t512v8r1-bulk-two_pass-c2-p0-s3"),
    ("float32", 32768, "t512v4r1-bulk-two_pass-c2-p0-s2"),
    ("float32", 65536, "t512v4r1-bulk-two_pass-c4-p0-s2"),
    ("bfloat16", 16384, "t256v8r1-smem-two_pass-c1-p0-m64"),
)
SMS = 132


def main() -> None:
    args = lab_eval.lab_arguments(offline=False).parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records = []
    for dtype, hidden, label in SHAPES:
        problem, config = Problem(hidden, dtype), KernelConfig.from_label(label)
        plan = codegen.render(config, problem).launch
        rows = (1 << 26) // hidden
        if plan.resident:
            slots = SMS // plan.cluster * plan.blocks_per_sm
            row_counts = [rows, rows // slots * slots, -(-rows // slots) * slots]
        else:
            slots = 0
            row_counts = [rows]
        timed = lab_eval.time_at_rows(problem, config, row_counts, args.rounds)
        for r, (ev, ts) in timed.items():
            us = statistics.median(t.median_us for t in ts)
            share = ev.nbytes / (us * 1e-6) / 1e9 / ts[0].copy_gbps
            rounds = r / slots if slots else 0
            print(f"{dtype:8s} {hidden:6d} {label:34s} rows {r:5d} ({rounds:5.2f} rounds of "
                  f"{slots}) {us:8.2f} us {us / r * 1e3:7.2f} ns/row {share * 100:5.1f}% of copy",
                  flush=True)
            records.append(dict(dtype=dtype, hidden=hidden, label=label, rows=r, slots=slots,
                                us=us, share=share, rounds_us=[t.median_us for t in ts]))
        json.dump(records, open(out / "tail_lab.json", "w"), indent=1)
        del timed
        lab_eval.free_gpu_memory()


if __name__ == "__main__":
    main()
