"""Measuring one shape: every implementation checked, then timed, and a progress line for each."""

from __future__ import annotations

import math
import time
import traceback

from . import constants
from .checks import check_outputs, largest_magnitude
from .constants import EPS
from .failures import short_error, sync_quietly
from .formats import format_or_dash
from .impls import Impls, Unavailable, as_torch, torch_dtype
from .ops import OPS
from .shapes import Shape, gbps_of, new_record
from .timing import bench_ms, flushed_ms, graph_ms, host_us


def run_shape(shape: Shape, impls: Impls, names: list[str], seed: int, log) -> list[dict]:
    import torch

    recs = []
    dtype = torch_dtype(shape.dtype)
    torch.manual_seed(seed)
    op = OPS[shape.op]
    x = torch.randn(shape.rows, shape.hidden, device=constants.DEVICE, dtype=dtype)
    w = (1.0 + 0.1 * torch.randn(shape.hidden, device=constants.DEVICE)).to(dtype)
    b = (0.1 * torch.randn(shape.hidden, device=constants.DEVICE)).to(dtype) if (
        op.has_bias) else None
    r = torch.randn(shape.rows, shape.hidden, device=constants.DEVICE, dtype=dtype) if (
        op.has_residual) else None
    ref = op.reference(impls.F, shape, x, w, b, EPS, r)
    refs = ref if isinstance(ref, tuple) else (ref,)
    ref_norms = tuple(t.norm() for t in refs)
    for impl in names:
        rec = new_record(shape, impl)
        try:
            fn, info = impls.make(impl, shape, x, w, b, EPS, r)
            restore = info.pop("restore", None)  # the in-place form's: puts its inputs back
            rec.update(info)
            t0 = time.perf_counter()
            out = as_torch(fn())
            torch.cuda.synchronize()
            rec["first_call_s"] = time.perf_counter() - t0
            check_outputs(rec, out, refs, ref_norms)
            del out
            if shape.suite == "latency":
                measure_latency(rec, shape, fn, restore)
            else:
                # Both flushes back to back, so drift between them stays small: the read flush
                # is the primary number, the zeroing one compares with do_bench-era runs.
                ms, p20, p80 = flushed_ms(fn, "read", restore)
                rec.update(ms=ms, ms_p20=p20, ms_p80=p80, gbps=gbps_of(shape.bytes, ms))
                mz, z20, z80 = flushed_ms(fn, "zero", restore)
                rec.update(ms_zero=mz, ms_zero_p20=z20, ms_zero_p80=z80,
                           gbps_zero=gbps_of(shape.bytes, mz))
        except Unavailable as exc:
            rec["status"] = "unavailable"
            rec["error"] = str(exc)
        except Exception as exc:  # noqa: BLE001
            if rec["status"] != "WRONG":
                rec["status"] = "error"
            rec["error"] = short_error(exc)
            rec["traceback"] = traceback.format_exc()[-3000:]
            sync_quietly()
        recs.append(rec)
        log(progress_line(rec))
    del x, w, b, r, ref, refs
    torch.cuda.empty_cache()
    return recs


def measure_latency(rec: dict, shape: Shape, fn, restore=None) -> None:
    """Time ``fn`` by do_bench, CUDA-graph replay and host time into ``rec``.

    Each of the three launches ``fn`` back to back, so an in-place form (``restore`` given)
    runs on its own last outputs there: each launch adds the last y to the last h. Its inputs
    are put back before each of the three, and the largest |x| or |residual| after them is
    recorded (``max_abs_after_timing``; ``finite_after_timing``). In fp16 they overflow after
    some thousands of launches; the timing does not depend on the values.
    """
    peaks: list[float] = []

    def measured(measure):
        if restore is not None:
            restore()
        result = measure(fn)
        if restore is not None:
            peaks.append(largest_magnitude(as_torch(fn())))
        return result

    ms, p20, p80 = measured(bench_ms)
    rec.update(ms=ms, ms_p20=p20, ms_p80=p80, gbps=gbps_of(shape.bytes, ms))
    try:
        g, _, _ = measured(graph_ms)
        rec["graph_us"] = g * 1e3
    except Exception as exc:  # noqa: BLE001
        rec["graph_error"] = short_error(exc)
        sync_quietly()
    try:
        rec["host_us"] = measured(host_us)
    except Exception as exc:  # noqa: BLE001
        rec["host_error"] = short_error(exc)
        sync_quietly()
    if peaks:
        rec["max_abs_after_timing"] = max(peaks)
        rec["finite_after_timing"] = math.isfinite(max(peaks))


def progress_line(r: dict) -> str:
    head = f"{r['suite']:7s} {r['dtype']} h={r['hidden']:<6d} rows={r['rows']:<6d} {r['impl']:8s}"
    if r["status"] in ("error", "unavailable", "skipped"):
        return f"{head} {r['status'].upper()}: {r.get('error')}"
    parts = [f"{r['status']:5s}", f"err={format_or_dash(r['rel_err'], '.1e')}"]
    if "h_rel_err" in r:
        parts.append(f"h err={format_or_dash(r['h_rel_err'], '.1e')} "
                     f"max|dh|={format_or_dash(r['h_max_abs_err'], '.1e')}")
    if r["ms"] is not None:
        parts.append(f"{r['ms'] * 1e3:9.1f} us")
    if r["gbps"] is not None:
        parts.append(f"{r['gbps']:6.0f} GB/s")
    if r.get("gbps_zero") is not None:
        parts.append(f"(zeroing flush {r['ms_zero'] * 1e3:.1f} us {r['gbps_zero']:.0f} GB/s)")
    if r.get("graph_us") is not None:
        parts.append(f"graph {r['graph_us']:.1f} us")
    if r.get("host_us") is not None:
        parts.append(f"host {r['host_us']:.1f} us")
    if r.get("path"):
        parts.append(f"path={r['path']}")
    if r.get("first_call_s") is not None and r["first_call_s"] > 1.0:
        parts.append(f"first call {r['first_call_s']:.1f} s")
    if "finite_after_timing" in r:
        parts.append(f"max |x|, |r| after timing {format_or_dash(r['max_abs_after_timing'], '.3g')}"
                     + ("" if r["finite_after_timing"] else " NOT FINITE"))
    return f"{head} " + "  ".join(parts)
