"""Time backward kernels on few rows by CUDA-graph replay, against eager torch, compile, Liger.

Run on a GPU machine with torch and triton, from the repository root::

    python benchmarks/backward_latency.py --hidden 4096,16384 --rows 1,8,64,256 --dtypes bf16

At few rows a backward is a launch and a reduction, not a stream of bytes: what counts is its
time. Each implementation is captured in a CUDA graph and replayed
(``triton.testing.do_bench_cudagraph``, the median of its replays, L2 not flushed), so launch
overhead on the host is left out for all alike. autonorm's dispatched backward kernel (through
``torch.ops.autonorm.norm_backward``) and torch's eager backward given the saved statistics are
timed alone; torch.compile's backward and Liger-Kernel's as a forward plus backward less the
forward alone, as ``benchmarks/backward.py`` does, since their backward kernels cannot be
launched alone. The table gives microseconds and autonorm's speed over the fastest peer
(its time over autonorm's).

``--configs`` adds a line per configuration label (``BackwardConfig.label()``) under each
shape's dispatched one, timed the same way with its own kernel, the peers left blank and its
speed over the same fastest peer: the way to compare kernels at few rows, where the tuner's
timing (rotated inputs, events round one launch) measures launch overhead too::

    python benchmarks/backward_latency.py --hidden 4096 --rows 1,8,64,256 --dtypes bf16,fp32 \
        --configs t128v8-bulk-accregisters-p1-s2-c4,t256v8-bulk-accregisters-p1-s4-h
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

# benchmarks/ is not a package: the sibling script's helpers are imported from its folder.
sys.path.insert(0, str(Path(__file__).resolve().parent))
import backward as bench  # noqa: E402

PEERS = bench.PEERS
MISSING = bench.MISSING


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line (no GPU needed for ``--help``)."""
    parser = argparse.ArgumentParser(description="Backward kernels on few rows by CUDA-graph "
                                                 "replay, against torch's eager, torch.compile "
                                                 "and Liger-Kernel (where installed), in us.")
    parser.add_argument("--hidden", default="4096,16384", help="comma-separated hidden sizes")
    parser.add_argument("--rows", default="1,8,64,256", help="comma-separated row counts")
    parser.add_argument("--dtypes", default="bf16", help="comma-separated: bf16,fp16,fp32")
    parser.add_argument("--configs", default="",
                        help="comma-separated backward kernel labels to time beside the "
                             "dispatched one (a label that cannot run a shape shows '-')")
    return parser.parse_args(argv)


def table_header() -> list[str]:
    """The table's heading and rule lines, one column per peer."""
    cols = ["op", "dtype", "hidden", "rows", "autonorm us", *(f"{p} us" for p in PEERS),
            "speed"]
    return ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]


def fastest_peer(peers: Mapping[str, float | None]) -> float | None:
    """The shortest time among the peers that were measured; None where none was.

    Args:
        peers: microseconds by peer name; None (or a non-positive figure, a difference of two
            timings swamped by noise) marks one not measured.
    """
    measured = [t for t in (peers.get(p) for p in PEERS) if t is not None and t > 0]
    return min(measured, default=None)


def format_row(op: str, dtype: str, hidden: int, rows: int, ours: float | None,
               peers: Mapping[str, float | None]) -> str:
    """One table line: autonorm's and each peer's microseconds, and the speed over the fastest.

    Args:
        op: "layer_norm" or "rms_norm".
        dtype: the dtype's short name, as on the command line.
        hidden: the hidden size.
        rows: rows of x.
        ours: autonorm's time, us; None where it was not measured (shows "-").
        peers: us by peer name (see ``PEERS``); a missing or None one shows "-" and does not
            count toward the fastest.
    """
    def us(t: float | None) -> str:
        return MISSING if t is None or t <= 0 else f"{t:.1f}"

    best = fastest_peer(peers)
    cells = [op, dtype, str(hidden), str(rows), us(ours), *(us(peers.get(p)) for p in PEERS),
             MISSING if best is None or ours is None else f"{best / ours:.2f}x"]
    return "| " + " | ".join(cells) + " |"


def main(argv: list[str] | None = None) -> int:
    """Time every shape and print one table; return the exit code."""
    args = parse_args(argv)
    from peerbench.gpu import require_gpu

    require_gpu("backward_latency.py", torch=True, triton=True)
    import torch
    from triton.testing import do_bench_cudagraph

    import autonorm.torch  # noqa: F401 - registers torch.ops.autonorm

    graph_bench = bench.median_bench(do_bench_cudagraph)
    liger = bench.liger_functions()
    labels = [label for label in args.configs.split(",") if label]
    print("\n".join(table_header()))
    for dtype in args.dtypes.split(","):
        for hidden in map(int, args.hidden.split(",")):
            compiled = _compiled_norms(hidden)
            for rows in map(int, args.rows.split(",")):
                for line in _time_shape(getattr(torch, bench.DTYPES[dtype]), dtype, hidden, rows,
                                        compiled, graph_bench, liger, labels):
                    print(line, flush=True)
    return 0


def _compiled_norms(hidden: int) -> dict[str, Callable]:
    """torch.compile of torch's norms by op, as ``norm(x, w, b) -> y``, one per hidden size.

    Kept across row counts: after the second shape torch.compile makes the rows dynamic, so a
    hidden size compiles twice (with and without grad), not once per row count. Dynamo's
    caches are cleared first: its entries count per code object, across hidden sizes and
    dtypes, and past ``recompile_limit`` it would run these lambdas eagerly.
    """
    import torch
    import torch.nn.functional as F  # noqa: N812

    torch._dynamo.reset()

    return {
        "layer_norm": torch.compile(lambda t, wt, bt: F.layer_norm(t, (hidden,), wt, bt, 1e-5)),
        "rms_norm": torch.compile(lambda t, wt, bt: F.rms_norm(t, (hidden,), wt, 1e-6)),
    }


def _time_shape(tdtype, dtype: str, hidden: int, rows: int,  # noqa: ANN001
                compiled: Mapping[str, Callable], graph_bench: Callable,
                liger: tuple[Callable, Callable] | None, labels: list[str]) -> list[str]:
    """Time both norms' backwards at one shape by graph replay; return their table lines.

    Each label of ``labels`` adds a line under its op's, its kernel's time against the same
    peers.
    """
    import torch

    x = torch.randn(rows, hidden, device="cuda", dtype=tdtype)
    dy = torch.randn_like(x)
    w = (1 + 0.1 * torch.randn(hidden, device="cuda")).to(tdtype)
    b = (0.1 * torch.randn(hidden, device="cuda")).to(tdtype)
    kernels = bench._backward_kernels(x, dy, w, b)
    liger_norms = bench._liger_norms(liger)
    lines = []
    for op, (ours, eager) in kernels.items():
        ours()  # dispatch and compile outside the capture
        eager()
        ms = {"autonorm": graph_bench(ours), "eager": graph_bench(eager),
              "compile": bench._backward_ms(compiled[op], x, dy, w, b, graph_bench)}
        if liger_norms[op] is not None:
            ms["liger"] = bench._liger_ms(op, bench._backward_ms, liger_norms[op], x, dy, w, b,
                                          graph_bench)
        ours_us = 1e3 * ms.pop("autonorm")
        peers = {p: 1e3 * t if t is not None else None for p, t in ms.items()}
        lines.append(format_row(op, dtype, hidden, rows, ours_us, peers))
        for label, launch in _config_kernels(op, x, dy, w, labels).items():
            us = None if launch is None else 1e3 * graph_bench(launch)
            lines.append(format_row(f"{op} {label}", dtype, hidden, rows, us, peers))
    return lines


def _config_kernels(op: str, x, dy, w, labels: list[str]) -> dict[str, Callable | None]:  # noqa: ANN001
    """A launch of each label's backward kernel on these tensors by label; None where the
    configuration cannot run the shape.

    The kernel is launched as the dispatched one is (``autonorm.torch``'s backward op: the
    same parameters, partials and workspace counter), on outputs allocated once.
    """
    if not labels:
        return {}
    import torch

    from autonorm.ops import registry
    from autonorm.ops.norm_backward.config import BackwardConfig
    from autonorm.runtime.compiler import compile_kernel
    from autonorm.runtime.device import query_device

    device = x.device.index or 0
    family = registry.get(f"{op}_backward")
    rows, hidden = x.shape
    problem = family.problem(hidden=hidden, dtype=str(x.dtype).removeprefix("torch."))
    limits = query_device(device).limits()
    eps = 1e-5 if op == "layer_norm" else 1e-6
    launches: dict[str, Callable | None] = {}
    for label in labels:
        config = BackwardConfig.from_label(label)
        if family.check(config, problem, limits):
            launches[label] = None
            continue
        kernel = compile_kernel(family.render(config, problem, limits), device)
        clusters = kernel.grid(rows) // kernel.plan.cluster
        dx, dw, db = torch.empty_like(x), torch.empty_like(w), torch.empty_like(w)
        partials = torch.empty(problem.partial_floats(rows, clusters), dtype=torch.float32,
                               device=x.device)
        args = (x.data_ptr(), dy.data_ptr(), w.data_ptr(), dx.data_ptr(), dw.data_ptr(),
                db.data_ptr() if problem.has_bias else 0, partials.data_ptr(), 0, rows, eps)

        def launch(kernel=kernel, args=args, keep=(dx, dw, db, partials)) -> None:  # noqa: ANN001
            kernel.launch(args, torch.cuda.current_stream(x.device).cuda_stream)

        launch()
        launches[label] = launch
    return launches


if __name__ == "__main__":
    raise SystemExit(main())
