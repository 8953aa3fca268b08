"""Time the backward kernels against torch's eager backward, in one run.

Run on a GPU machine with torch and triton, from the repository root::

    python benchmarks/backward.py --hidden 1024,4096,16384,65536 --dtypes bf16,fp32

For LayerNorm and RMSNorm, each dtype and hidden size, at rows = 2^26 / hidden: autonorm's
dispatched backward kernel (user DB, shipped DB or the default; through
``torch.ops.autonorm.norm_backward``) and torch's eager backward given the saved statistics
(``aten.native_layer_norm_backward``, ``aten._fused_rms_norm_backward``), both timed by
``triton.testing.do_bench`` (L2 flushed before each launch, median). Bytes counted: x and dy
read and dx written once, the weight read and each column sum written once. Prints GB/s, the
share of the device's copy bandwidth and autonorm's speed over torch's.
"""

from __future__ import annotations

import argparse

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line (no GPU needed for ``--help``)."""
    parser = argparse.ArgumentParser(description="Backward kernels against torch's eager "
                                                 "backward, % of copy bandwidth.")
    parser.add_argument("--hidden", default="1024,4096,16384,65536",
                        help="comma-separated hidden sizes")
    parser.add_argument("--dtypes", default="bf16,fp32", help="comma-separated: bf16,fp16,fp32")
    parser.add_argument("--elements", type=int, default=1 << 26, help="elements per launch")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Time every shape and print one table; return the exit code."""
    args = parse_args(argv)
    import torch
    from triton.testing import do_bench

    import autonorm.torch  # noqa: F401 - registers torch.ops.autonorm
    from autonorm.runtime.timing import copy_bandwidth_gbps

    copy = copy_bandwidth_gbps(0)
    print(f"copy bandwidth {copy:.0f} GB/s")
    print("| op | dtype | hidden | autonorm GB/s | % copy | torch GB/s | % copy | speed |")
    print("|---|---|---|---|---|---|---|---|")
    for dtype in args.dtypes.split(","):
        for hidden in map(int, args.hidden.split(",")):
            rows = max(1, args.elements // hidden)
            for line in _time_shape(getattr(torch, DTYPES[dtype]), dtype, hidden, rows, copy,
                                    do_bench):
                print(line, flush=True)
            torch.cuda.empty_cache()
    return 0


def _time_shape(tdtype, dtype: str, hidden: int, rows: int, copy: float, do_bench) -> list[str]:  # noqa: ANN001
    """Time both norms' backwards at one shape; return their table lines."""
    import torch

    aten = torch.ops.aten
    x = torch.randn(rows, hidden, device="cuda", dtype=tdtype)
    dy = torch.randn_like(x)
    w = (1 + 0.1 * torch.randn(hidden, device="cuda")).to(tdtype)
    b = (0.1 * torch.randn(hidden, device="cuda")).to(tdtype)
    _, mean, rstd = aten.native_layer_norm(x, [hidden], w, b, 1e-5)
    _, rrms = aten._fused_rms_norm(x, [hidden], w, 1e-6)
    cases = {
        "layer_norm": (
            lambda: torch.ops.autonorm.norm_backward(dy, x, w, False, True, False, 1e-5),
            lambda: aten.native_layer_norm_backward(dy, x, [hidden], mean, rstd, w, b,
                                                    [True, True, True]), 2),
        "rms_norm": (
            lambda: torch.ops.autonorm.norm_backward(dy, x, w, True, False, False, 1e-6),
            lambda: aten._fused_rms_norm_backward(dy, x, [hidden], rrms, w, [True, True]), 1),
    }
    lines = []
    for op, (ours, theirs, sums) in cases.items():
        nbytes = (3 * rows + 1 + sums) * hidden * x.element_size()
        ours()  # dispatch and compile outside the timing
        t_ours = do_bench(ours, rep=200)
        t_theirs = do_bench(theirs, rep=200)
        g_ours, g_theirs = nbytes / t_ours / 1e6, nbytes / t_theirs / 1e6
        lines.append(f"| {op} | {dtype} | {hidden} | {g_ours:.0f} | {100 * g_ours / copy:.1f} "
                     f"| {g_theirs:.0f} | {100 * g_theirs / copy:.1f} "
                     f"| {t_theirs / t_ours:.2f}x |")
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
