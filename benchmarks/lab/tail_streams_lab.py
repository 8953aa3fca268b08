"""Lab only: would a finer last round pay? The last rows handed to a finer kernel beside the winner.

The wide 16-bit winners lose their points to a fixed cost per launch (NOTES.md 84), and at the
same tile (64 KB rows, t512 c1 s2) fp32 16384 reads 94.9% of copy where bf16 32768 reads 91.4%:
the same microseconds of ramp and drain over half the bytes. Most of the drain is the tile's
granularity: when the tiles run out, each SM still finishes the row it holds, so the SMs stop
over about one tile's time (~4 us). A kernel that split only its last rows across a cluster would
halve that. Before building one, this measures the same effect with two kernels: the winner on
the first rows on one stream, a clustered kernel (its rows split across 2-4 SMs) on the last
``tail`` rows on a second stream, launched right after it, so its clusters take SMs as the
winner's persistent blocks leave. Single launches after an L2 flush, interleaved, medians;
the share of a same-bytes copy timed in the same rounds; outputs checked against the winner's
alone.

Run on the GPU machine: ``python benchmarks/lab/tail_streams_lab.py --out $OUT``.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import cupy
import lab_eval

from autonorm import codegen, compiler, dispatch
from autonorm.space import KernelConfig, Problem

# (dtype, hidden, the finer kernel for the tail, tail row counts)
PLAN = (
    ("bfloat16", 32768, "t256v8r1-bulk-two_pass-c2-p0-s2", (66, 132, 264)),
    ("bfloat16", 32768, "t128v8r1-bulk-two_pass-c4-p0-s2", (132, 264)),
    ("float16", 32768, "t256v8r1-bulk-two_pass-c2-p0-s2", (132, 264)),
    ("float32", 16384, "t256v4r1-bulk-two_pass-c2-p0-s2", (132, 264, 396)),
    ("bfloat16", 16384, "t256v8r1-bulk-two_pass-c2-p0-s2", (132, 264)),
)
ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4}
CUPY_DTYPE = {"bfloat16": cupy.uint16, "float16": cupy.float16, "float32": cupy.float32}


def main() -> None:
    ap = lab_eval.lab_arguments(offline=False)
    ap.add_argument("--reps", type=int, default=30)
    ap.set_defaults(rounds=3)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    flush = cupy.empty(512 << 20, dtype=cupy.uint8)
    s1, s2 = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    results = []
    for dtype, hidden, tail_label, tails in PLAN:
        problem = Problem(hidden, dtype)
        rows = (1 << 26) // hidden
        main_kernel = dispatch.get_kernel(problem, rows)
        main_label = dispatch.chosen(problem, rows).config.label()
        tail_kernel = compiler.compile_kernel(
            codegen.render(KernelConfig.from_label(tail_label), problem))
        rng = cupy.random.default_rng(0)
        xf = rng.standard_normal((rows, hidden), dtype=cupy.float32)
        if dtype == "bfloat16":
            x = (xf.view(cupy.uint32) >> 16).astype(cupy.uint16)
            w = cupy.full(hidden, 0x3F80, dtype=cupy.uint16)  # 1.0
            b = cupy.zeros(hidden, dtype=cupy.uint16)
        else:
            x = xf.astype(CUPY_DTYPE[dtype])
            w = cupy.ones(hidden, dtype=CUPY_DTYPE[dtype])
            b = cupy.zeros(hidden, dtype=CUPY_DTYPE[dtype])
        y = cupy.empty_like(x)
        ref = cupy.empty_like(x)
        # The inputs and every poison fill come from CuPy's default stream; s1 and s2 do not
        # wait for it, so each is followed by a device-wide synchronize.
        cupy.cuda.Device().synchronize()
        row_bytes = hidden * ITEMSIZE[dtype]

        def run(tail: int, y=y, drop: bool = False) -> None:
            head = rows - tail
            main_kernel.launch(x.data.ptr, w.data.ptr, b.data.ptr, y.data.ptr, head, 1e-5,
                               stream_ptr=s1.ptr)
            if tail and not drop:
                tail_kernel.launch(x.data.ptr + head * row_bytes, w.data.ptr, b.data.ptr,
                                   y.data.ptr + head * row_bytes, tail, 1e-5, stream_ptr=s2.ptr)

        def copy() -> None:
            cupy.cuda.runtime.memcpyAsync(y.data.ptr, x.data.ptr, x.nbytes,
                                          cupy.cuda.runtime.memcpyDeviceToDevice, s1.ptr)

        def timed(fn) -> float:
            with s1:
                flush.fill(1)
            s1.synchronize()
            e0, et, e1 = cupy.cuda.Event(), cupy.cuda.Event(), cupy.cuda.Event()
            e0.record(s1)
            s2.wait_event(e0)
            fn()
            et.record(s2)
            s1.wait_event(et)
            e1.record(s1)
            e1.synchronize()
            return cupy.cuda.get_elapsed_time(e0, e1) * 1e3

        # The winner alone is the reference output; each split must match it closely (the
        # tail kernel merges segment statistics, so bits may differ in the last place).
        main_kernel.launch(x.data.ptr, w.data.ptr, b.data.ptr, ref.data.ptr, rows, 1e-5,
                           stream_ptr=s1.ptr)
        s1.synchronize()
        variants = {"alone": lambda: run(0), "copy": copy}
        for t in tails:
            variants[f"tail{t}"] = (lambda t=t: run(t))
            # The winner on the first rows only: what the last rows cost it, for comparison.
            variants[f"head{t}"] = (lambda t=t: run(t, drop=True))
        check = {}
        for name, fn in variants.items():
            if name == "copy" or name.startswith("head"):
                continue
            y.fill(0xFFFF if dtype == "bfloat16" else cupy.nan)  # NaN: never time zeros
            cupy.cuda.Device().synchronize()
            timed(fn)
            cupy.cuda.Device().synchronize()
            if dtype == "bfloat16":
                a = (y.astype(cupy.uint32) << 16).view(cupy.float32)
                r = (ref.astype(cupy.uint32) << 16).view(cupy.float32)
            else:
                a, r = y.astype(cupy.float32), ref.astype(cupy.float32)
            check[name] = float(cupy.nanmax(cupy.abs(a - r))) if bool(
                cupy.isfinite(a).all()) else float("nan")
        times: dict[str, list[float]] = {n: [] for n in variants}
        for fn in variants.values():  # warm-up
            timed(fn)
        for _ in range(args.rounds):
            for _ in range(args.reps):
                for name, fn in variants.items():
                    times[name].append(timed(fn))
        med = {n: statistics.median(v) for n, v in times.items()}
        row = {"dtype": dtype, "hidden": hidden, "rows": rows, "main": main_label,
               "tail_kernel": tail_label, "median_us": med, "max_abs_diff": check,
               "share_of_copy": {n: med["copy"] / v for n, v in med.items() if n != "copy"}}
        results.append(row)
        print(f"{dtype} {hidden} main {main_label} tail {tail_label}", flush=True)
        for n in med:
            if n == "copy":
                continue
            print(f"   {n:8s} {med[n]:7.2f} us  {100 * med['copy'] / med[n]:5.1f}% of copy  "
                  f"x{med['alone'] / med[n]:.3f} of alone  max|diff| {check.get(n, 0.0):.2e}",
                  flush=True)
        print(f"   copy     {med['copy']:7.2f} us", flush=True)
        (out / "tail_streams_lab.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
