"""Time the backward kernels against torch's eager backward, torch.compile and Liger-Kernel.

Run on a GPU machine with torch and triton, from the repository root::

    python benchmarks/backward.py --hidden 1024,4096,16384,65536 --dtypes bf16,fp32

For LayerNorm and RMSNorm, each dtype and hidden size, at rows = 2^26 / hidden: autonorm's
dispatched backward kernel (user DB, shipped DB or the default; through
``torch.ops.autonorm.norm_backward``) and torch's eager backward given the saved statistics
(``aten.native_layer_norm_backward``, ``aten._fused_rms_norm_backward``), both timed by
``triton.testing.do_bench`` (L2 flushed before each launch, median); then torch.compile's
backward and Liger-Kernel's (``LigerLayerNormFunction``, ``LigerRMSNormFunction`` with its
defaults: no offset, "llama" casting, dx written over dy), each timed as a forward plus
backward less the forward alone, since their backward kernels cannot be launched alone. Every
implementation computes dx and the weight's (and LayerNorm's bias') gradient. Liger is optional:
where ``liger_kernel`` does not import, or fails at a shape (it refuses hidden past 65536), its
column shows "-". Bytes counted: x and dy read and dx written once, the weight read and each
column sum written once. Prints GB/s, the share of the device's copy bandwidth for autonorm and
for the best of its peers (eager, compile, Liger), and autonorm's speed over that best.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
PEERS = ("eager", "compile", "liger")
MISSING = "-"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line (no GPU needed for ``--help``)."""
    parser = argparse.ArgumentParser(description="Backward kernels against torch's eager "
                                                 "backward, torch.compile and Liger-Kernel "
                                                 "(where installed), % of copy bandwidth.")
    parser.add_argument("--hidden", default="1024,4096,16384,65536",
                        help="comma-separated hidden sizes")
    parser.add_argument("--dtypes", default="bf16,fp32", help="comma-separated: bf16,fp16,fp32")
    parser.add_argument("--elements", type=int, default=1 << 26, help="elements per launch")
    return parser.parse_args(argv)


def table_header() -> list[str]:
    """The table's heading and rule lines, one column per peer."""
    cols = ["op", "dtype", "hidden", "autonorm GB/s", "% copy", *(f"{p} GB/s" for p in PEERS),
            "best % copy", "speed"]
    return ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]


def best_peer(peers: Mapping[str, float | None]) -> float | None:
    """The highest GB/s among the peers that were measured; None where none was.

    Args:
        peers: GB/s by peer name; None (or a non-positive figure) marks one not measured.
    """
    measured = [g for g in (peers.get(p) for p in PEERS) if g is not None and g > 0]
    return max(measured, default=None)


def format_row(op: str, dtype: str, hidden: int, copy: float, ours: float,
               peers: Mapping[str, float | None]) -> str:
    """One table line: autonorm's and each peer's GB/s, the best peer's share and the speed.

    Args:
        op: "layer_norm" or "rms_norm".
        dtype: the dtype's short name, as on the command line.
        hidden: the hidden size.
        copy: the device's copy bandwidth, GB/s.
        ours: autonorm's GB/s.
        peers: GB/s by peer name (see ``PEERS``); a missing or None one shows "-" and does not
            count toward the best.
    """
    def gbps(g: float | None) -> str:
        return MISSING if g is None or g <= 0 else f"{g:.0f}"

    best = best_peer(peers)
    cells = [op, dtype, str(hidden), f"{ours:.0f}", f"{100 * ours / copy:.1f}",
             *(gbps(peers.get(p)) for p in PEERS),
             MISSING if best is None else f"{100 * best / copy:.1f}",
             MISSING if best is None else f"{ours / best:.2f}x"]
    return "| " + " | ".join(cells) + " |"


def liger_functions() -> tuple[Callable, Callable] | None:
    """Liger-Kernel's LayerNorm and RMSNorm autograd Functions, or None where it does not import.

    Any error counts as absent, not only ImportError: a Liger built for another torch or triton
    fails at import in other ways, and the other columns are worth having without it.
    """
    try:
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except Exception as exc:  # noqa: BLE001
        print(f"Liger-Kernel not used ({type(exc).__name__}: {exc})", file=sys.stderr)
        return None
    return LigerLayerNormFunction, LigerRMSNormFunction


def main(argv: list[str] | None = None) -> int:
    """Time every shape and print one table; return the exit code."""
    args = parse_args(argv)
    import torch
    from triton.testing import do_bench

    import autonorm.torch  # noqa: F401 - registers torch.ops.autonorm
    from autonorm.runtime.timing import copy_bandwidth_gbps

    liger = liger_functions()
    copy = copy_bandwidth_gbps(0)
    print(f"copy bandwidth {copy:.0f} GB/s")
    print("\n".join(table_header()))
    for dtype in args.dtypes.split(","):
        for hidden in map(int, args.hidden.split(",")):
            rows = max(1, args.elements // hidden)
            for line in _time_shape(getattr(torch, DTYPES[dtype]), dtype, hidden, rows, copy,
                                    do_bench, liger):
                print(line, flush=True)
            torch.cuda.empty_cache()
    return 0


def _time_shape(tdtype, dtype: str, hidden: int, rows: int, copy: float, do_bench,  # noqa: ANN001
                liger: tuple[Callable, Callable] | None) -> list[str]:
    """Time both norms' backwards at one shape; return their table lines."""
    import torch
    import torch.nn.functional as F  # noqa: N812

    aten = torch.ops.aten
    x = torch.randn(rows, hidden, device="cuda", dtype=tdtype)
    dy = torch.randn_like(x)
    w = (1 + 0.1 * torch.randn(hidden, device="cuda")).to(tdtype)
    b = (0.1 * torch.randn(hidden, device="cuda")).to(tdtype)
    _, mean, rstd = aten.native_layer_norm(x, [hidden], w, b, 1e-5)
    _, rrms = aten._fused_rms_norm(x, [hidden], w, 1e-6)
    liger_norms = _liger_norms(liger)
    # op: (autonorm's backward, eager's backward, the forward torch.compile and Liger
    # differentiate (None: Liger absent), column sums)
    cases = {
        "layer_norm": (
            lambda: torch.ops.autonorm.norm_backward(dy, x, w, False, True, False, 1e-5),
            lambda: aten.native_layer_norm_backward(dy, x, [hidden], mean, rstd, w, b,
                                                    [True, True, True]),
            lambda t, wt, bt: F.layer_norm(t, (hidden,), wt, bt, 1e-5),
            liger_norms["layer_norm"], 2),
        "rms_norm": (
            lambda: torch.ops.autonorm.norm_backward(dy, x, w, True, False, False, 1e-6),
            lambda: aten._fused_rms_norm_backward(dy, x, [hidden], rrms, w, [True, True]),
            lambda t, wt, bt: F.rms_norm(t, (hidden,), wt, 1e-6),
            liger_norms["rms_norm"], 1),
    }
    lines = []
    for op, (ours, eager, norm, liger_norm, sums) in cases.items():
        nbytes = (3 * rows + 1 + sums) * hidden * x.element_size()
        ours()  # dispatch and compile outside the timing
        g_ours = nbytes / do_bench(ours, rep=200) / 1e6
        ms = {"eager": do_bench(eager, rep=200),
              "compile": _backward_ms(torch.compile(norm), x, dy, w, b, do_bench)}
        if liger_norm is not None:
            ms["liger"] = _liger_backward_ms(op, liger_norm, x, dy, w, b, do_bench)
        # A non-positive difference is noise swamping the backward: shown as not measured.
        peers = {p: nbytes / t / 1e6 if t is not None and t > 0 else None for p, t in ms.items()}
        lines.append(format_row(op, dtype, hidden, copy, g_ours, peers))
    return lines


def _liger_norms(liger: tuple[Callable, Callable] | None) -> dict[str, Callable | None]:
    """Liger's forwards as ``norm(x, w, b) -> y`` by op; None for each where Liger is absent."""
    if liger is None:
        return {"layer_norm": None, "rms_norm": None}
    layer_norm, rms_norm = liger
    return {
        "layer_norm": lambda t, wt, bt: layer_norm.apply(t, wt, bt, 1e-5),
        # (offset, casting_mode, in_place) at Liger's defaults, positional as its own
        # liger_rms_norm passes them: what its users run, fp32 statistics as autonorm's.
        "rms_norm": lambda t, wt, bt: rms_norm.apply(t, wt, 1e-6, 0.0, "llama", True),
    }


def _liger_backward_ms(op: str, norm, x, dy, w, b, do_bench) -> float | None:  # noqa: ANN001
    """Liger's backward time (ms), or None where Liger fails at this shape (reported on stderr)."""
    try:
        return _backward_ms(norm, x, dy, w, b, do_bench)
    except Exception as exc:  # noqa: BLE001 - Triton's compile and launch errors have no common base
        print(f"Liger {op} at {tuple(x.shape)} {x.dtype}: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return None


def _backward_ms(norm, x, dy, w, b, do_bench) -> float:  # noqa: ANN001
    """A norm's backward: its forward + backward less its forward alone (ms).

    Args:
        norm: ``norm(x, w, b) -> y``, differentiable in all three.
        x, dy, w, b: the input, the output's gradient, the weight and the bias.
        do_bench: ``triton.testing.do_bench``.
    """
    import torch

    # Leaves needing grad, so the backward computes dw (and db) as autonorm's and eager's do;
    # a weight without grad would let it skip the column sums the byte count includes.
    leaf, w_leaf, b_leaf = (t.detach().requires_grad_() for t in (x, w, b))
    # Liger's RMSNorm writes dx over the gradient it is given: a private copy keeps the other
    # columns' dy intact. Its values drift over the repeats; the kernels' time does not depend
    # on them.
    grad = dy.clone()

    def forward() -> None:
        with torch.no_grad():
            norm(x, w, b)

    def both() -> None:
        norm(leaf, w_leaf, b_leaf).backward(grad)
        # Cleared, not accumulated: accumulating would add a kernel per gradient.
        leaf.grad = w_leaf.grad = b_leaf.grad = None

    both()
    forward()
    return do_bench(both, rep=200) - do_bench(forward, rep=200)


if __name__ == "__main__":
    raise SystemExit(main())
