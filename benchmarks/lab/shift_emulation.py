"""Emulate the fp32 two-pass kernel's arithmetic in float32 on the CPU (NumPy).

Each thread sums its vectors sequentially, then the threads' sums meet in a pairwise tree, as in
the kernels. Compares the shipped two-pass (pass 1: mean of x - shift, the shift being the row's
first element; pass 2 about it) with the corrected two-pass (pass 2 also sums x - centre and the
row is re-based on centre) on offset rows (mean 1000, spread 0.1) whose first element is z
spreads away from the mean. Relative L2 error against float64; fp32 tolerance is 2e-6.

    python benchmarks/lab/shift_emulation.py
"""

from __future__ import annotations

import numpy as np

F = np.float32


def tree_sum(parts: list[np.float32]) -> np.float32:
    """Pairwise sum, as the shuffle and shared-memory reductions do."""
    while len(parts) > 1:
        parts = [F(parts[i] + parts[i + 1]) for i in range(0, len(parts), 2)]
    return parts[0]


def thread_elements(n: int, threads: int, vec: int) -> list[list[int]]:
    """Element indices of each thread: vectors t, t + threads, ..."""
    per: list[list[int]] = [[] for _ in range(threads)]
    for j, vector in enumerate(np.arange(n).reshape(-1, vec)):
        per[j % threads].extend(vector.tolist())
    return per


def normalize(x: np.ndarray, threads: int = 512, vec: int = 4,
              corrected: bool = False) -> np.ndarray:
    """The kernel's output (no affine) for one fp32 row, in emulated fp32 arithmetic."""
    n = x.size
    shift = x[0]
    per = thread_elements(n, threads, vec)
    sums = []
    for elements in per:
        acc = F(0)
        for i in elements:
            acc = F(acc + F(x[i] - shift))
        sums.append(acc)
    mean = F(tree_sum(sums) * F(1.0 / n))
    centre = F(shift + mean)
    squares, deviations = [], []
    for elements in per:
        sq, dev = F(0), F(0)
        for i in elements:
            d = F(x[i] - centre) if corrected else F(F(x[i] - shift) - mean)
            sq = F(sq + F(d * d))
            dev = F(dev + d)
        squares.append(sq)
        deviations.append(dev)
    if corrected:
        delta = F(tree_sum(deviations) / F(n))
        var = F(F(tree_sum(squares) / F(n)) - F(delta * delta))
        rstd = F(1) / np.sqrt(F(var + F(1e-5)), dtype=F)
        return (F(x - centre) - delta) * rstd
    var = F(tree_sum(squares) * F(1.0 / n))
    rstd = F(1) / np.sqrt(F(var + F(1e-5)), dtype=F)
    return (F(x - shift) - mean) * rstd


def rel_error(x: np.ndarray, corrected: bool, threads: int) -> float:
    xd = x.astype(np.float64)
    ref = (xd - xd.mean()) / np.sqrt(xd.var() + 1e-5)
    y = normalize(x, threads=threads, corrected=corrected).astype(np.float64)
    return float(np.linalg.norm(y - ref) / np.linalg.norm(ref))


def main() -> None:
    rng = np.random.default_rng(0)
    base = 1000 + 0.1 * rng.standard_normal(16384)
    for n, threads, zs in ((4096, 256, (0, 10, 100, 1000)), (16384, 512, (1000, 10000))):
        for z in zs:
            row = base[:n].copy()
            row[0] = 1000 + 0.1 * z
            x = row.astype(F)
            print(f"n {n:5d} first element z {z:5d}: shipped {rel_error(x, False, threads):.2e}"
                  f"  corrected {rel_error(x, True, threads):.2e}")
    # The verification case "offset-outlier-first": outliers 3000 spreads up at 0 and n/2.
    for n in (768, 4096, 16384):
        row = base[:n].copy()
        row[[0, n // 2]] = 1300.0
        x = row.astype(F)
        print(f"n {n:5d} outliers at 0 and n/2:    shipped {rel_error(x, False, 256):.2e}"
              f"  corrected {rel_error(x, True, 256):.2e}")


if __name__ == "__main__":
    main()
