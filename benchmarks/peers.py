#!/usr/bin/env python3
"""Compare autonorm's LayerNorm, RMSNorm or fused add + RMSNorm forward with its peers on a GPU.

LayerNorm peers (the default, ``--op layer_norm``): PyTorch eager (``F.layer_norm``),
``torch.compile`` of it (``dynamic=False``), a Triton-tutorial-style kernel
(``benchmarks/triton_tutorial_ln.py``) and Liger-Kernel's LayerNorm. RMSNorm peers
(``--op rms_norm``): eager ``F.rms_norm``, ``torch.compile`` of it and Liger-Kernel's RMSNorm
(its default "llama" casting). Fused residual add + RMSNorm (``--op add_rms_norm``: ``h = x +
residual``, ``y = rms_norm(h) * w``, both returned): eager ``h = x + r`` then ``F.rms_norm(h)``,
``torch.compile`` of the two together and Liger-Kernel's fused add RMSNorm; autonorm runs
functional and, as ``autonorm-inplace``, in place (vLLM's form: ``residual`` becomes h, ``x``
becomes y). What differs between the ops is the table ``OPS`` (``peerbench/ops.py``).

Run on the GPU machine, from the repository root::

    python3 benchmarks/peers.py --out results/     # everything (about 5 minutes on an H200)
    python3 benchmarks/peers.py --quick --out $OUT # fewer sweep shapes
    python3 benchmarks/peers.py --op rms_norm --quick --out $OUT  # RMSNorm
    python3 benchmarks/peers.py --op add_rms_norm --quick --out $OUT  # fused add + RMSNorm
    python3 benchmarks/peers.py --selftest         # no GPU: tables, JSON, plot on fake numbers

Method (docs/timing.md; the H200 figures are in docs/results.md): every implementation is
first checked against a float64 reference on the same input (relative L2 error; above 1e-2 for
bf16/fp16 or 1e-4 for fp32 it is flagged WRONG), then timed. The fused add returns two outputs:
both are checked, h against the float64 sum rounded once to the dtype (its largest absolute
difference is reported too: a correctly rounded sum has none).

Bandwidth suites (sweep, llm) time single launches between CUDA events, each after a flush of
the L2, median of the repeats, under two flushes back to back:

- ``read`` (primary): sum a 256 MB buffer. The inputs are evicted and the L2 holds only clean
  lines, so the launch pays for its own traffic and nothing else.
- ``zero`` (secondary, what ``triton.testing.do_bench`` does): zero the same buffer. The L2 is
  left full of dirty lines whose write-back lands inside the timed launch, a fixed 4-6 us per
  launch on an H200; kept for comparison with figures timed by ``do_bench``.

The share is GB/s over a device-to-device copy of the same bytes as x (2 x that moved), timed
under the same flush in the same run: a fixed cost weighs more on a short launch, so a copy of
another size would be a biased yardstick. A fixed 2^28-byte copy is timed too, for reference.
Latency shapes are timed with ``do_bench`` (its zeroing flush), by CUDA-graph replay
(``do_bench_cudagraph``, L2 not flushed) and host-inclusive (wall time of back-to-back calls).
Bandwidth counts x read once, y written once, weight and bias (RMSNorm: the weight) read once;
the fused add also reads the residual once and writes h once, and its share is over a copy of
x's and the residual's bytes (the same bytes moved). The in-place form runs on copies of x and
the residual of its own, which each launch overwrites (adding the last y to the last h, values
grow, and overflow in fp16 after some thousands of launches): its correctness is checked on the
first launch, on fresh copies; they are put back before each timed launch of the bandwidth
suites (before its flush, outside the timed window) and before each latency measurement, which
launches back to back (the largest value after it is reported). A failure of one
implementation at one shape becomes an error row; the run carries on. Results are written to
``--out`` after every shape, so a run cut short still leaves ``peers.json``.
"""

from __future__ import annotations

import faulthandler
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))  # benchmarks/ is not a package: peerbench is found through HERE

from peerbench import constants  # noqa: E402
from peerbench.arguments import parse_args  # noqa: E402
from peerbench.constants import COPY_BYTES  # noqa: E402
from peerbench.copies import (  # noqa: E402
    copy_rates,
    copy_sizes,
    finalize,
    measure_copies,
    used_copies,
)
from peerbench.failures import short_error, sync_quietly  # noqa: E402
from peerbench.impls import Impls  # noqa: E402
from peerbench.measurement import run_shape  # noqa: E402
from peerbench.meta import collect_meta  # noqa: E402
from peerbench.report import write_json, write_plot  # noqa: E402
from peerbench.selftest import selftest  # noqa: E402
from peerbench.shapes import build_shapes, new_record  # noqa: E402
from peerbench.summary import copy_lines, print_summary  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.selftest:
        return selftest(args)
    start = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out / "peers.json", out / "peers.png"

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - start:6.1f}s] {msg}", flush=True)

    faulthandler.enable()  # a hard crash still prints where it happened
    import torch

    if constants.DEVICE == "cuda" and not torch.cuda.is_available():
        print("peers.py needs a CUDA GPU (try --selftest)", file=sys.stderr)
        return 2
    torch.set_grad_enabled(False)
    meta = collect_meta(args)
    impls = Impls(args.impls, args.liger_wheel, args.op)
    meta["liger"] = impls.versions.get("liger")
    meta["autonorm"] = impls.versions.get("autonorm")
    meta["unavailable"] = impls.unavailable
    meta["notes"] = impls.notes
    meta["json_path"], meta["png_path"] = str(json_path), str(png_path)
    for name, why in impls.unavailable.items():
        log(f"{name} unavailable: {why}")

    shapes = build_shapes(args)
    log(f"{len(shapes)} shapes x {len(args.impls)} implementations on {meta.get('device')}")
    sizes = copy_sizes(shapes)
    copy_start = measure_copies(sizes)
    for line in copy_lines({"start": copy_start}):
        log(line)
    meta["copy"] = {"sizes": sizes, "fixed_bytes_buffer": COPY_BYTES, "start": copy_start}
    rates = copy_rates(copy_start)

    records: list[dict] = []
    for i, shape in enumerate(shapes):
        if time.perf_counter() - start > args.budget_s:
            for impl in args.impls:
                rec = new_record(shape, impl)
                rec["status"] = "skipped"
                rec["error"] = f"time budget of {args.budget_s:.0f} s spent"
                records.append(rec)
            continue
        try:
            records.extend(run_shape(shape, impls, args.impls, seed=1000 + i, log=log))
        except Exception as exc:  # noqa: BLE001 - e.g. out of memory making the inputs
            log(f"{shape.label()}: shape failed: {short_error(exc)}")
            for impl in args.impls:
                rec = new_record(shape, impl)
                rec["error"] = f"shape setup failed: {short_error(exc)}"
                records.append(rec)
            sync_quietly()
        finalize(records, rates)
        try:
            write_json(json_path, meta, records, complete=False)
        except Exception as exc:  # noqa: BLE001
            log(f"could not write {json_path}: {short_error(exc)}")

    copy_end = measure_copies(sizes)
    meta["copy"]["end"] = copy_end
    meta["copy"]["used"] = used_copies(copy_start, copy_end)
    meta["copy"]["note"] = ("each share uses the larger of the start and end copy GB/s of its "
                            "size and flush")
    finalize(records, copy_rates(copy_start, copy_end))
    meta["wall_s"] = time.perf_counter() - start
    try:
        err = write_plot(png_path, meta, records, args.impls)
    except Exception as exc:  # noqa: BLE001
        err = f"plot failed: {short_error(exc)}"
    if err:
        meta["png_path"] = None
        meta["plot_error"] = err
        log(f"no plot: {err}")
    write_json(json_path, meta, records, complete=True)
    print_summary(meta, records, args.impls, args.plain)
    print(f"total {meta['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
