"""Time the backward kernels against torch's eager backward, in one run.

Run on a GPU machine with torch and triton, from the repository root::

    python benchmarks/backward.py --hidden 1024,4096,16384,65536 --dtypes bf16,fp32

For LayerNorm and RMSNorm, each dtype and hidden size, at rows = 2^26 / hidden: autonorm's
dispatched backward kernel (user DB, shipped DB or the default; through
``torch.ops.autonorm.norm_backward``) and torch's eager backward given the saved statistics
(``aten.native_layer_norm_backward``, ``aten._fused_rms_norm_backward``), both timed by
``triton.testing.do_bench`` (L2 flushed before each launch, median); and torch.compile's
backward, timed as a compiled forward plus backward less the compiled forward (its backward
kernels cannot be launched alone). Bytes counted: x and dy read and dx written once, the
weight read and each column sum written once. Prints GB/s, the share of the device's copy
bandwidth and autonorm's speed over the faster of torch's two.
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
    print("| op | dtype | hidden | autonorm GB/s | % copy | eager GB/s | compile GB/s "
          "| best % copy | speed |")
    print("|---|---|---|---|---|---|---|---|---|")
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
        t_eager = do_bench(theirs, rep=200)
        t_compile = _compiled_backward_ms(op, x, dy, w, b, do_bench)
        g_ours, g_eager = nbytes / t_ours / 1e6, nbytes / t_eager / 1e6
        g_compile = nbytes / t_compile / 1e6 if t_compile > 0 else 0.0
        best = max(g_eager, g_compile)
        lines.append(f"| {op} | {dtype} | {hidden} | {g_ours:.0f} | {100 * g_ours / copy:.1f} "
                     f"| {g_eager:.0f} | {g_compile:.0f} | {100 * best / copy:.1f} "
                     f"| {g_ours / best:.2f}x |")
    return lines


def _compiled_backward_ms(op: str, x, dy, w, b, do_bench) -> float:  # noqa: ANN001
    """torch.compile's backward of the norm: compiled forward + backward less the forward (ms)."""
    import torch
    import torch.nn.functional as F  # noqa: N812

    hidden = x.shape[-1]
    if op == "layer_norm":
        def norm(t):  # noqa: ANN001, ANN202
            return F.layer_norm(t, (hidden,), w, b, 1e-5)
    else:
        def norm(t):  # noqa: ANN001, ANN202
            return F.rms_norm(t, (hidden,), w, 1e-6)
    compiled = torch.compile(norm)
    leaf = x.detach().requires_grad_()

    def forward() -> None:
        with torch.no_grad():
            compiled(x)

    def both() -> None:
        compiled(leaf).backward(dy)
        leaf.grad = None

    both()
    forward()
    return do_bench(both, rep=200) - do_bench(forward, rep=200)


if __name__ == "__main__":
    raise SystemExit(main())
