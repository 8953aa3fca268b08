"""Warp stall samples of a kernel by pass: ncu's per-SASS source page, cut at barriers and waits.

Reads the CSV that ``ncu -i REPORT --page source --csv --print-source sass`` writes (one table
per kernel, lab/call_s18a.sh) and prints, for each stretch of SASS that ends at a block barrier
(BAR.SYNC), an mbarrier wait (TRYWAIT) or an exit, its share of the warp stall samples and of
the executed warp instructions, and every single instruction that holds 2% or more of the
samples. In the bulk kernel those stretches are the prologue, the wait for a tile, the first row
sum, the second, and the store pass.

    python benchmarks/lab/ncu_sass_summary.py sass.csv
"""

from __future__ import annotations

import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
CUTS = ("BAR.SYNC", "TRYWAIT", "EXIT")


def read_kernels(path: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """(kernel name, header, instruction rows) for each kernel table of the CSV."""
    kernels: list[tuple[str, list[str], list[list[str]]]] = []
    for row in csv.reader(open(path)):
        if row and row[0] == "Kernel Name":
            kernels.append((row[1], [], []))
        elif row and row[0] == "Address" and kernels:
            kernels[-1][1].extend(row)
        elif kernels and kernels[-1][1] and len(row) > 5:
            kernels[-1][2].append(row)
    return kernels


def summarize(name: str, header: list[str], rows: list[list[str]]) -> None:
    """Print the kernel's stretches and hot instructions."""
    col = {k: i for i, k in enumerate(header)}

    def count(row: list[str], key: str) -> int:
        return int(row[col[key]] or 0)

    total = sum(count(r, SAMPLES) for r in rows) or 1
    executed = sum(count(r, EXECUTED) for r in rows) or 1
    print(f"== {name}: {total} samples, {executed} warp instructions")
    start = samples = instr = 0
    for i, row in enumerate(rows):
        op = row[1].strip()
        samples += count(row, SAMPLES)
        instr += count(row, EXECUTED)
        if count(row, SAMPLES) >= 0.02 * total:
            print(f"   hot {i:4d} {count(row, SAMPLES):6d} "
                  f"({100 * count(row, SAMPLES) / total:4.1f}%) {op[:60]}")
        if any(cut in op for cut in CUTS) or i == len(rows) - 1:
            print(f"SASS {start:4d}-{i:4d}: samples {100 * samples / total:4.1f}%, "
                  f"instructions {100 * instr / executed:4.1f}%, ends {op[:45]}")
            start, samples, instr = i + 1, 0, 0


def main() -> None:
    for name, header, rows in read_kernels(sys.argv[1]):
        summarize(name, header, rows)


if __name__ == "__main__":
    main()
