"""Time backward kernels, or forward + backward steps, against eager torch, torch.compile, Liger.

Run on a GPU machine with torch and triton, from the repository root::

    python benchmarks/backward.py --hidden 1024,4096,16384,65536 --dtypes bf16,fp32
    python benchmarks/backward.py --mode training --hidden 4096 --dtypes bf16

For LayerNorm and RMSNorm, each dtype and hidden size, at rows = 2^26 / hidden, every
implementation is timed by ``triton.testing.do_bench`` (L2 flushed before each launch, the
median of its runs) and computes dx and the weight's (and LayerNorm's bias') gradient. Liger is
optional: where ``liger_kernel`` does not import, or fails at a shape (it refuses hidden past
65536), its column shows "-". Liger's RMSNorm runs with its defaults (no offset, "llama"
casting, dx written over dy, so each timing hands it a private copy of dy). The table gives
GB/s, the share of the device's copy bandwidth for autonorm and for the best of its peers
(eager, compile, Liger), and autonorm's speed over that best; a line above it names the mode.

``--mode backward`` (the default) times the backward kernels: autonorm's dispatched backward
kernel (user DB, shipped DB or the default; through ``torch.ops.autonorm.norm_backward``) and
torch's eager backward given the saved statistics (``aten.native_layer_norm_backward``,
``aten._fused_rms_norm_backward``); then torch.compile's backward and Liger-Kernel's
(``LigerLayerNormFunction``, ``LigerRMSNormFunction``), each a forward plus backward less the
forward alone, since their backward kernels cannot be launched alone. Bytes counted: x and dy
read and dx written once, the weight read and each column sum written once.

``--mode training`` times one forward plus backward step of the norm, x, weight and bias
requiring grad and the gradients cleared after each step: ``autonorm.torch.layer_norm`` and
``autonorm.torch.rms_norm`` (autograd through the custom ops), ``F.layer_norm`` and
``F.rms_norm`` eager, torch.compile of those, and Liger's two Functions. Bytes counted: the
forward's (x read, y written, the weight and LayerNorm's bias read once) plus the backward's as
above.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import sys
from collections.abc import Callable, Mapping

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
PEERS = ("eager", "compile", "liger")
MISSING = "-"
MODES = ("backward", "training")
# Affine parameters per op (LayerNorm's weight and bias, RMSNorm's weight): each is read once
# by the forward, and the backward writes one column sum per parameter.
PARAMS = {"layer_norm": 2, "rms_norm": 1}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line (no GPU needed for ``--help``)."""
    parser = argparse.ArgumentParser(description="Backward kernels, or forward + backward "
                                                 "steps, against torch's eager, torch.compile "
                                                 "and Liger-Kernel (where installed), % of copy "
                                                 "bandwidth.")
    parser.add_argument("--mode", choices=MODES, default="backward",
                        help="backward: the backward kernels alone (default); training: one "
                             "forward plus backward step")
    parser.add_argument("--hidden", default="1024,4096,16384,65536",
                        help="comma-separated hidden sizes")
    parser.add_argument("--dtypes", default="bf16,fp32", help="comma-separated: bf16,fp16,fp32")
    parser.add_argument("--elements", type=int, default=1 << 26, help="elements per launch")
    return parser.parse_args(argv)


def mode_title(mode: str) -> str:
    """The line above the table that names the mode and what its bytes count.

    Args:
        mode: one of ``MODES``.

    Raises:
        ValueError: mode is not one of ``MODES``.
    """
    titles = {"backward": "backward kernels alone",
              "training": "one forward + backward step (bytes: forward's + backward's)"}
    if mode not in titles:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return f"mode {mode}: {titles[mode]}"


def norm_bytes(mode: str, op: str, rows: int, hidden: int, itemsize: int) -> int:
    """The bytes one timed call must move at least, for the GB/s.

    Args:
        mode: "backward" or "training".
        op: "layer_norm" or "rms_norm".
        rows: rows of x.
        hidden: the hidden size.
        itemsize: bytes per element of x's dtype.

    Raises:
        ValueError: mode is not one of ``MODES``.
    """
    params = PARAMS[op]
    # x and dy read, dx written; the weight read once, each column sum written once.
    backward = 3 * rows + 1 + params
    # x read, y written, each parameter read once.
    forward = 2 * rows + params
    elements = {"backward": backward, "training": forward + backward}
    if mode not in elements:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return elements[mode] * hidden * itemsize


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


def median_bench(do_bench: Callable) -> Callable:
    """Return ``do_bench`` made to report the median of its runs, in ms.

    Triton's ``do_bench`` reports the mean unless asked (``return_mode``); older versions give
    quantiles instead.
    """
    params = inspect.signature(do_bench).parameters
    if "return_mode" in params:
        return functools.partial(do_bench, return_mode="median")
    if "quantiles" in params:
        return lambda fn, **kw: float(do_bench(fn, quantiles=[0.5], **kw)[0])
    return do_bench


def main(argv: list[str] | None = None) -> int:
    """Time every shape and print one table; return the exit code."""
    args = parse_args(argv)
    from peerbench.gpu import require_gpu

    require_gpu("backward.py", torch=True, triton=True)
    import torch
    from triton.testing import do_bench as triton_bench

    import autonorm.torch  # noqa: F401 - registers torch.ops.autonorm
    from autonorm.runtime.timing import copy_bandwidth_gbps

    do_bench = median_bench(triton_bench)
    liger = liger_functions()
    copy = copy_bandwidth_gbps(0)
    print(f"copy bandwidth {copy:.0f} GB/s")
    print(mode_title(args.mode))
    print("\n".join(table_header()))
    for dtype in args.dtypes.split(","):
        for hidden in map(int, args.hidden.split(",")):
            rows = max(1, args.elements // hidden)
            for line in _time_shape(args.mode, getattr(torch, DTYPES[dtype]), dtype, hidden,
                                    rows, copy, do_bench, liger):
                print(line, flush=True)
            torch.cuda.empty_cache()
    return 0


def _time_shape(mode: str, tdtype, dtype: str, hidden: int, rows: int, copy: float,  # noqa: ANN001
                do_bench, liger: tuple[Callable, Callable] | None) -> list[str]:  # noqa: ANN001
    """Time both norms at one shape in the given mode; return their table lines."""
    import torch
    import torch.nn.functional as F  # noqa: N812

    import autonorm.torch as ant

    x = torch.randn(rows, hidden, device="cuda", dtype=tdtype)
    dy = torch.randn_like(x)
    w = (1 + 0.1 * torch.randn(hidden, device="cuda")).to(tdtype)
    b = (0.1 * torch.randn(hidden, device="cuda")).to(tdtype)
    liger_norms = _liger_norms(liger)
    # op: (autonorm's forward, torch's forward), as norm(x, w, b) -> y; torch.compile compiles
    # torch's, and the training mode times all of them.
    norms = {
        "layer_norm": (lambda t, wt, bt: ant.layer_norm(t, wt, bt, 1e-5),
                       lambda t, wt, bt: F.layer_norm(t, (hidden,), wt, bt, 1e-5)),
        "rms_norm": (lambda t, wt, bt: ant.rms_norm(t, wt, 1e-6),
                     lambda t, wt, bt: F.rms_norm(t, (hidden,), wt, 1e-6)),
    }
    kernels = _backward_kernels(x, dy, w, b) if mode == "backward" else {}
    # Dynamo's entries count per code object across shapes: past its recompile_limit the
    # compiled norms below would run eagerly. A fresh cache per shape compiles each anew.
    torch._dynamo.reset()
    lines = []
    for op, (ours_norm, torch_norm) in norms.items():
        nbytes = norm_bytes(mode, op, rows, hidden, x.element_size())
        compiled = torch.compile(torch_norm)
        if mode == "backward":
            ours, eager = kernels[op]
            ours()  # dispatch and compile outside the timing
            ms = {"autonorm": do_bench(ours, rep=200), "eager": do_bench(eager, rep=200),
                  "compile": _backward_ms(compiled, x, dy, w, b, do_bench)}
            if liger_norms[op] is not None:
                ms["liger"] = _liger_ms(op, _backward_ms, liger_norms[op], x, dy, w, b,
                                        do_bench)
        else:
            steps = {"autonorm": ours_norm, "eager": torch_norm, "compile": compiled,
                     "liger": liger_norms[op]}
            ms = _training_peers_ms(op, steps, x, dy, w, b, do_bench)
        ours_gbps = nbytes / ms.pop("autonorm") / 1e6
        # A non-positive difference (backward mode's compile and Liger) is noise swamping the
        # backward: shown as not measured.
        peers = {p: nbytes / t / 1e6 if t is not None and t > 0 else None for p, t in ms.items()}
        lines.append(format_row(op, dtype, hidden, copy, ours_gbps, peers))
    return lines


def _backward_kernels(x, dy, w, b) -> dict[str, tuple[Callable, Callable]]:  # noqa: ANN001
    """autonorm's and torch eager's backward launches by op, given the forward's statistics."""
    import torch

    aten = torch.ops.aten
    hidden = x.shape[-1]
    _, mean, rstd = aten.native_layer_norm(x, [hidden], w, b, 1e-5)
    _, rrms = aten._fused_rms_norm(x, [hidden], w, 1e-6)
    return {
        "layer_norm": (
            lambda: torch.ops.autonorm.norm_backward(dy, x, w, False, True, False, 1e-5),
            lambda: aten.native_layer_norm_backward(dy, x, [hidden], mean, rstd, w, b,
                                                    [True, True, True])),
        "rms_norm": (
            lambda: torch.ops.autonorm.norm_backward(dy, x, w, True, False, False, 1e-6),
            lambda: aten._fused_rms_norm_backward(dy, x, [hidden], rrms, w, [True, True])),
    }


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


def _liger_ms(op: str, timer: Callable, norm, x, dy, w, b,  # noqa: ANN001
              do_bench) -> float | None:  # noqa: ANN001
    """Liger's time (ms) by ``timer``, or None where Liger fails at this shape (on stderr).

    Args:
        op: "layer_norm" or "rms_norm", for the message.
        timer: ``_backward_ms`` or ``_training_ms``.
        norm, x, dy, w, b, do_bench: as ``timer`` takes them.
    """
    try:
        return timer(norm, x, dy, w, b, do_bench)
    except Exception as exc:  # noqa: BLE001 - Triton's compile and launch errors have no common base
        print(f"Liger {op} at {tuple(x.shape)} {x.dtype}: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return None


def _training_peers_ms(op: str, norms: Mapping[str, Callable | None], x, dy, w, b,  # noqa: ANN001
                       do_bench) -> dict[str, float | None]:  # noqa: ANN001
    """One forward + backward step's time (ms) for each implementation of an op.

    Args:
        op: "layer_norm" or "rms_norm", for Liger's failure message.
        norms: ``norm(x, w, b) -> y`` by name ("autonorm" and ``PEERS``); None where absent
            (Liger not installed), left out of the result.
        x, dy, w, b, do_bench: as ``_training_ms`` takes them.

    Returns:
        ms by name; Liger's is None where it fails at this shape. A failure of any other
        implementation propagates: those are expected to run everywhere the script does.
    """
    ms: dict[str, float | None] = {}
    for name, norm in norms.items():
        if norm is None:
            continue
        if name == "liger":
            ms[name] = _liger_ms(op, _training_ms, norm, x, dy, w, b, do_bench)
        else:
            ms[name] = _training_ms(norm, x, dy, w, b, do_bench)
    return ms


def _step(norm, x, dy, w, b) -> Callable[[], None]:  # noqa: ANN001
    """A forward + backward step of ``norm`` on leaves needing grad, clearing the gradients.

    Args:
        norm: ``norm(x, w, b) -> y``, differentiable in all three.
        x, dy, w, b: the input, the output's gradient, the weight and the bias; none is changed.
    """
    # Leaves needing grad, so the backward computes dw (and db) as autonorm's and eager's do;
    # a weight without grad would let it skip the column sums the byte count includes.
    leaf, w_leaf, b_leaf = (t.detach().requires_grad_() for t in (x, w, b))
    # Liger's RMSNorm writes dx over the gradient it is given: a private copy keeps the other
    # columns' dy intact. Its values drift over the repeats; the kernels' time does not depend
    # on them.
    grad = dy.clone()

    def both() -> None:
        norm(leaf, w_leaf, b_leaf).backward(grad)
        # Cleared, not accumulated: accumulating would add a kernel per gradient, and only to
        # the calls after the first, so every implementation is timed on the same terms.
        leaf.grad = w_leaf.grad = b_leaf.grad = None

    return both


def _training_ms(norm, x, dy, w, b, do_bench) -> float:  # noqa: ANN001
    """One forward + backward step of a norm (ms), gradients cleared after each.

    Args:
        norm: ``norm(x, w, b) -> y``, differentiable in all three.
        x, dy, w, b: the input, the output's gradient, the weight and the bias.
        do_bench: ``triton.testing.do_bench``.
    """
    both = _step(norm, x, dy, w, b)
    both()  # dispatch, compile and autotune outside the timing
    return do_bench(both, rep=200)


def _backward_ms(norm, x, dy, w, b, do_bench) -> float:  # noqa: ANN001
    """A norm's backward: its forward + backward less its forward alone (ms).

    Args:
        norm: ``norm(x, w, b) -> y``, differentiable in all three.
        x, dy, w, b: the input, the output's gradient, the weight and the bias.
        do_bench: ``triton.testing.do_bench``.
    """
    import torch

    both = _step(norm, x, dy, w, b)

    def forward() -> None:
        with torch.no_grad():
            norm(x, w, b)

    both()
    forward()
    return do_bench(both, rep=200) - do_bench(forward, rep=200)


if __name__ == "__main__":
    raise SystemExit(main())
