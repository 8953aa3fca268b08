"""Lab only: what the dynamic schedule is worth to launches captured into a CUDA graph.

Until session 19 a launch captured into a graph got no tile counter and took the static
schedule (``workspace``); now each captured launch gets a counter of its own. For each shape's
dispatched kernel (the shipped DB) this captures two graphs of ``LAUNCHES`` launches over two
alternating input/output sets (each set larger than the L2 at 2^26 elements): one as the product
captures now, one with ``workspace.graph_counter`` answering 0 (the old static schedule). The
graphs are replayed back to back, interleaved over rounds; per launch, medians. Both graphs'
outputs must be bit-identical (the schedule does not change a row's arithmetic).

``--sweep`` instead times a fixed list of bulk configs at 1-32 tiles a resident cluster, the
static against the dynamic schedule, in graphs as above: where the dynamic schedule starts to pay
(rows 512 at bf16 16384 ran x0.90 with it in call s19a).

Run on the GPU machine: ``python benchmarks/lab/graph_sched_lab.py --out $OUT [--sweep]``.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import cupy
import lab_eval
import numpy as np

from autonorm import codegen, compiler, dispatch, workspace
from autonorm.reference import from_float64
from autonorm.space import KernelConfig, Problem

LAUNCHES = 8
# (dtype, hidden, rows): the peers' 2^26-element shapes whose winners are bulk kernels, a fwd
# winner as the control (both graphs the same), and the latency suite's rows-512 bulk shape.
SHAPES = [
    ("bfloat16", 32768, 2048), ("bfloat16", 65536, 1024), ("float16", 32768, 2048),
    ("float16", 65536, 1024), ("float32", 12288, 5461), ("float32", 16384, 4096),
    ("float32", 32768, 2048), ("float32", 65536, 1024), ("bfloat16", 16384, 4096),
    ("bfloat16", 16384, 512),
]
# --sweep: (dtype, hidden, bulk config) at these tiles per resident cluster.
SWEEP = [
    ("bfloat16", 16384, KernelConfig(256, 8, 1, "bulk", "two_pass", 1, 0, 3)),
    ("bfloat16", 32768, KernelConfig(256, 8, 1, "bulk", "two_pass", 2, 0, 2)),
    ("float32", 16384, KernelConfig(512, 4, 1, "bulk", "two_pass", 1, 0, 2)),
    ("float32", 65536, KernelConfig(256, 4, 1, "bulk", "two_pass", 8, 0, 2)),
]
TILES_PER_CLUSTER = (1, 2, 3, 4, 6, 8, 12, 16, 32)


def capture(kernel, sets, rows: int, stream, static: bool):  # noqa: ANN001, ANN201
    """A graph of LAUNCHES launches alternating over ``sets``; ``static`` as before session 19."""
    real = workspace.graph_counter
    if static:
        workspace.graph_counter = lambda device_id: 0
    try:
        with stream:
            stream.begin_capture()
            for i in range(LAUNCHES):
                x, w, b, y = sets[i % len(sets)]
                kernel.launch(x.data.ptr, w.data.ptr, b.data.ptr, y.data.ptr, rows, 1e-5,
                              stream.ptr)
            return stream.end_capture()
    finally:
        workspace.graph_counter = real


def measure(kernel, problem: Problem, rows: int, rng, stream, rounds: int) -> dict:  # noqa: ANN001
    """Static against dynamic graphs of ``kernel`` at ``rows``; outputs checked bit for bit."""
    dtype, hidden = problem.dtype, problem.hidden
    sets = []
    for _ in range(2):
        x = cupy.asarray(from_float64(rng.standard_normal((rows, hidden)) + 1, dtype))
        w = cupy.asarray(from_float64(1 + 0.1 * rng.standard_normal(hidden), dtype))
        b = cupy.asarray(from_float64(0.1 * rng.standard_normal(hidden), dtype))
        sets.append((x, w, b, cupy.zeros_like(x)))
    # The sets were made (and zeroed) on CuPy's default stream, which `stream` does not wait
    # for: call c's first graph raced with the zeroing of its own outputs at fp32.
    cupy.cuda.Device().synchronize()
    graphs = {"dynamic": capture(kernel, sets, rows, stream, static=False),
              "static": capture(kernel, sets, rows, stream, static=True)}
    outputs = {}
    for name, graph in graphs.items():
        # Poison, replay and copy all on the graphs' stream: a fill or a copy on CuPy's default
        # stream is not ordered with it (calls a and b raced so, "same bits False" at fp32).
        with stream:
            for _, _, _, y in sets:
                y.fill(0)
            graph.launch(stream)
            outputs[name] = [s[3].copy() for s in sets]
        stream.synchronize()
    # Each graph's last outputs against a plain static launch on each set.
    with stream:
        for x, w, b, _ in sets:
            ref = cupy.zeros_like(x)
            kernel.launch(x.data.ptr, w.data.ptr, b.data.ptr, ref.data.ptr, rows, 1e-5,
                          stream.ptr, work_ptr=0)
            outputs.setdefault("plain", []).append(ref)
    stream.synchronize()
    plain_same = {name: all(bool((a.view(cupy.uint8) == r.view(cupy.uint8)).all())
                            for a, r in zip(outputs[name], outputs["plain"], strict=True))
                  for name in graphs}
    same = all(bool((a.view(cupy.uint8) == b.view(cupy.uint8)).all())
               for a, b in zip(outputs["dynamic"], outputs["static"], strict=True))
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    us: dict[str, list[float]] = {name: [] for name in graphs}
    for r in range(rounds):
        order = list(graphs) if r % 2 == 0 else list(reversed(graphs))
        for name in order:
            graphs[name].launch(stream)  # warm
            start.record(stream)
            for _ in range(4):
                graphs[name].launch(stream)
            stop.record(stream)
            stop.synchronize()
            us[name].append(cupy.cuda.get_elapsed_time(start, stop) * 1e3 / (4 * LAUNCHES))
    dyn, sta = statistics.median(us["dynamic"]), statistics.median(us["static"])
    nbytes = 2 * rows * hidden * problem.itemsize
    del graphs, sets, outputs
    cupy.get_default_memory_pool().free_all_blocks()
    return {"dtype": dtype, "hidden": hidden, "rows": rows,
            "config": kernel.rendered.config.label(),
            "dynamic_kernel": bool(kernel.plan.resident), "same_bits": same,
            "same_as_plain": plain_same,
            "dynamic_us": dyn, "static_us": sta, "speedup": sta / dyn,
            "dynamic_gbps": nbytes / dyn / 1e3, "rounds": us}


def report(rec: dict, extra: str = "") -> None:
    print(f"{rec['dtype']:9s} {rec['hidden']:6d} x{rec['rows']:5d} {rec['config']:34s}{extra} "
          f"static {rec['static_us']:8.2f} us  dynamic {rec['dynamic_us']:8.2f} us  "
          f"x{rec['speedup']:.3f}  {rec['dynamic_gbps']:6.0f} GB/s  same bits {rec['same_bits']} "
          f"as plain {rec['same_as_plain']}",
          flush=True)


def main() -> None:
    ap = lab_eval.lab_arguments(offline=False)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--only", default="",
                    help="dtype:hidden,... of SHAPES (or SWEEP) to run (all if empty)")
    ap.add_argument("--tiles", default="", help="--sweep: tiles per cluster, e.g. 1,4,8")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(3)
    stream = cupy.cuda.Stream(non_blocking=True)
    records = []
    if args.sweep:
        only = {tuple(item.split(":")) for item in args.only.split(",") if item}
        tiles = [int(t) for t in args.tiles.split(",")] if args.tiles else TILES_PER_CLUSTER
        for dtype, hidden, config in SWEEP:
            if only and (dtype, str(hidden)) not in only:
                continue
            problem = Problem(hidden, dtype)
            kernel = compiler.compile_kernel(codegen.render(config, problem))
            clusters = kernel.grid(1 << 30) // config.cluster
            for k in tiles:
                rows = k * clusters * config.rows_per_block
                rec = measure(kernel, problem, rows, rng, stream, args.rounds)
                rec.update(clusters=clusters, tiles_per_cluster=k)
                records.append(rec)
                report(rec, f" {k:2d}/cl")
        name = "graph_sched_sweep.json"
    else:
        only = {tuple(item.split(":")) for item in args.only.split(",") if item}
        for dtype, hidden, rows in SHAPES:
            if only and (dtype, str(hidden)) not in only:
                continue
            problem = Problem(hidden, dtype)
            rec = measure(dispatch.get_kernel(problem, rows), problem, rows, rng, stream,
                          args.rounds)
            records.append(rec)
            report(rec)
        name = "graph_sched_lab.json"
    (out / name).write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
