"""Self-test without a GPU: parsing, shapes, shares, tables, JSON and plot on synthetic numbers."""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import io
import json
import math
import random
from pathlib import Path

from .arguments import parse_args
from .constants import (
    ALL_IMPLS,
    BENCH_REP_MS,
    COPY_BYTES,
    DEFAULT_OP,
    FLUSH_MAX_REPS,
    FLUSH_MIN_REPS,
    IN_PLACE_IMPLS,
    QUICK_DTYPES,
    QUICK_HIDDEN,
)
from .copies import copy_rates, copy_sizes, finalize, used_copies
from .measurement import progress_line
from .ops import OPS
from .report import write_json, write_plot
from .shapes import Shape, build_shapes, gbps_of, new_record, op_fields
from .summary import print_summary
from .timing import call_bench, rep_count, summarize_ms


def synthetic_copies(sizes: list[int], read_gbps: float, writeback_us: float) -> list[dict]:
    """Copy entries as measure_copies returns them: one rate, plus a fixed zero-flush cost."""
    out = []
    for n in sizes:
        t_read = 2 * n / (read_gbps * 1e9) * 1e3
        for f, ms in (("read", t_read), ("zero", t_read + writeback_us * 1e-3)):
            out.append({"bytes_buffer": n, "bytes_moved": 2 * n, "flush": f, "ms": ms,
                        "ms_p20": ms * 0.99, "ms_p80": ms * 1.01, "gbps": gbps_of(2 * n, ms)})
    return out


def synthetic_records(shapes: list[Shape], names: list[str],
                      rates: dict[tuple[int, str], float]) -> list[dict]:
    rng = random.Random(0)
    records = []
    for si, shape in enumerate(shapes):
        for impl in names:
            rec = new_record(shape, impl)
            if impl == "liger" and si % 7 == 3:
                rec["status"], rec["error"] = "unavailable", "ModuleNotFoundError: liger_kernel"
                records.append(rec)
                continue
            if impl == "compile" and si % 9 == 4:
                rec["error"] = "BackendCompilerFailed: synthetic failure"
                records.append(rec)
                continue
            share = rng.uniform(0.3, 0.97)
            if shape.suite == "latency":
                ms = shape.bytes / (share * rates[(COPY_BYTES, "zero")] * 1e9) * 1e3 + 0.004
                rec["graph_us"] = ms * 1e3 * 0.8
                rec["host_us"] = ms * 1e3 + rng.uniform(2, 20)
            else:
                ms = shape.bytes / (share * rates[(shape.copy_bytes, "read")] * 1e9) * 1e3
                # The zeroing flush's write-back: a fixed few us per launch.
                mz = ms + rng.uniform(0.004, 0.006)
                rec.update(ms_zero=mz, ms_zero_p20=mz * 0.98, ms_zero_p80=mz * 1.03,
                           gbps_zero=gbps_of(shape.bytes, mz))
            err = rng.uniform(1e-4, 4e-3) if shape.dtype != "fp32" else rng.uniform(1e-8, 1e-7)
            if impl == "triton" and si % 5 == 2:
                err = float("nan")
            rec.update(rel_err=err, ms=ms, ms_p20=ms * 0.98, ms_p80=ms * 1.03,
                       gbps=gbps_of(shape.bytes, ms), first_call_s=rng.uniform(0.01, 3.0),
                       out_dtype=shape.dtype)
            rec["status"] = "ok" if (math.isfinite(err) and err <= rec["tol"]) else "WRONG"
            if OPS[shape.op].has_residual:  # a sum rounded once: h exact
                rec.update(h_rel_err=0.0, h_max_abs_err=0.0)
            if impl in IN_PLACE_IMPLS and shape.suite == "latency":
                rec.update(max_abs_after_timing=rng.uniform(50.0, 500.0), finite_after_timing=True)
            if impl in ("autonorm", *IN_PLACE_IMPLS):
                rec["path"] = "torch" if si % 2 else "dlpack"
            records.append(rec)
    return records


def selftest(args: argparse.Namespace) -> int:
    # Parsing checks.
    q = parse_args(["--quick", "--selftest"])
    assert q.hidden == list(QUICK_HIDDEN) and q.dtypes == list(QUICK_DTYPES), q
    a = parse_args(["--dtypes", "fp16", "--hidden", "512,768", "--suites", "sweep,llm",
                    "--impls", "eager,autonorm", "--selftest"])
    assert a.dtypes == ["fp16"] and a.hidden == [512, 768] and a.impls == ["eager", "autonorm"]
    assert [s.suite for s in build_shapes(a)] == ["llm", "llm", "sweep", "sweep"]
    for bad in (["--dtypes", "fp8"], ["--hidden", "x"], ["--impls", "cudnn"], ["--suites", ""],
                ["--op", "group_norm"], ["--op", "rms_norm", "--impls", "eager,triton"],
                ["--impls", "autonorm-inplace"], ["--op", "add_rms_norm", "--impls", "triton"]):
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                parse_args(bad)
        except SystemExit:
            pass
        else:
            raise AssertionError(f"accepted {bad}")
    full = build_shapes(parse_args(["--selftest"]))
    assert len(full) == 9 * 3 + 4 + 2, len(full)
    # Hidden 768 and 12288 are a few KiB short of 2^27 / 2^28 bytes: they share those copies.
    assert copy_sizes(full) == [2**25, 2**26, 2**27, 2**28], copy_sizes(full)
    assert Shape("latency", "bf16", 16384, 8).copy_bytes is None
    assert rep_count(0.07, BENCH_REP_MS) == FLUSH_MAX_REPS
    assert rep_count(10.0, BENCH_REP_MS) == FLUSH_MIN_REPS
    assert rep_count(0.2, BENCH_REP_MS) == 500
    assert summarize_ms([5.0, 1.0, 3.0, 2.0, 4.0]) == (3.0, 1.8, 4.2)
    s = Shape("sweep", "bf16", 4096, 2**26 // 4096)
    assert s.bytes == 2**26 * 2 * 2 + 2 * 4096 * 2
    # RMSNorm: its peers (no Triton tutorial), its shapes, one hidden-sized vector (the weight).
    r = parse_args(["--op", "rms_norm", "--quick", "--selftest"])
    assert r.impls == ["autonorm", "eager", "compile", "liger"], r.impls
    assert {sh.op for sh in build_shapes(r)} == {"rms_norm"}
    assert Shape("sweep", "fp32", 4096, 2**26 // 4096, "rms_norm").bytes == (
        2**26 * 4 * 2 + 4096 * 4)
    assert new_record(Shape("llm", "bf16", 4096, 4096, "rms_norm"), "eager")["op"] == "rms_norm"
    assert "op" not in new_record(s, "eager")  # LayerNorm records are as they always were
    # Fused add + RMSNorm: x and the residual read and y and h written once, the weight read
    # once; its share is over a copy of x's and the residual's bytes (the same bytes moved).
    f = parse_args(["--op", "add_rms_norm", "--quick", "--selftest"])
    assert f.impls == ["autonorm", "autonorm-inplace", "eager", "compile", "liger"], f.impls
    fused = Shape("sweep", "bf16", 4096, 2**26 // 4096, "add_rms_norm")
    assert fused.bytes == 2**26 * 2 * 4 + 4096 * 2, fused.bytes
    assert fused.copy_bytes == 2 * Shape("sweep", "bf16", 4096, 2**26 // 4096).copy_bytes == 2**28
    fused_rec = new_record(fused, "autonorm-inplace")
    assert fused_rec["op"] == "add_rms_norm" and fused_rec["h_max_abs_err"] is None, fused_rec
    assert "h_rel_err" not in new_record(s, "eager")
    for name, op in OPS.items():
        assert op.impls == tuple(i for i in ALL_IMPLS if i in op.impls), name
        assert "autonorm" in op.impls and op.vectors == 1 + op.has_bias, name
        assert op.row_streams == 2 + 2 * op.has_residual, name
        assert (op.in_place_call is not None) == any(i in IN_PLACE_IMPLS for i in op.impls), name
    assert abs(gbps_of(10**9, 1.0) - 1000.0) < 1e-9

    # Timing-helper plumbing with fake benchmark functions of each signature.
    def new_api(fn, warmup=25, rep=100, grad_to_none=None, quantiles=None, return_mode="mean"):
        return [1.0, 0.9, 1.2] if quantiles else 1.1

    def mode_api(fn, warmup=25, rep=100, return_mode="mean"):
        return 2.0 if return_mode == "median" else 9.9

    def old_api(fn, warmup=25, rep=100, percentiles=(0.2, 0.8)):
        return (3.0, 2.9, 3.1)

    assert call_bench(new_api, None, warmup=1, rep=1) == (1.0, 0.9, 1.2)
    assert call_bench(mode_api, None, warmup=1, rep=1) == (2.0, None, None)
    assert call_bench(old_api, None, warmup=1, rep=1) == (3.0, None, None)

    # Tables, JSON, plot on synthetic numbers.
    shapes = build_shapes(args)
    names = list(args.impls)
    sizes = copy_sizes(shapes)
    copy_start = synthetic_copies(sizes, 4250.0, 5.0)
    copy_end = synthetic_copies(sizes, 4230.0, 5.5)
    rates = copy_rates(copy_start, copy_end)
    # The larger of start and end is used; the zeroing flush's fixed cost lowers that copy.
    assert rates[(COPY_BYTES, "read")] == 4250.0, rates
    assert rates[(COPY_BYTES, "zero")] < rates[(COPY_BYTES, "read")], rates
    records = synthetic_records(shapes, names, rates)
    records.append(dict(new_record(Shape("llm", "bf16", 8192, 4096, args.op), "autonorm"),
                        status="skipped", error="time budget of 520 s spent"))
    finalize(records, rates)
    bw_ok = [r for r in records if r["suite"] != "latency" and r["status"] == "ok"]
    assert bw_ok or not any(s.suite != "latency" for s in shapes)
    for r in bw_ok:
        for key in ("share", "share_zero", "share_fixed_copy", "gbps_zero", "ms_zero"):
            assert r[key] is not None and math.isfinite(r[key]), (key, r)
    assert all(r["share_zero"] is None for r in records if r["suite"] == "latency")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "device": "SYNTHETIC (selftest)", "torch": "-", "triton": "-", "liger": "-",
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "copy": {"sizes": sizes, "fixed_bytes_buffer": COPY_BYTES, "start": copy_start,
                 "end": copy_end, "used": used_copies(copy_start, copy_end)},
        "json_path": str(out / "peers.json"), "png_path": str(out / "peers.png"),
        **op_fields(args.op),
    }
    for r in records[:8] + bw_ok[:4]:
        print(progress_line(r))
    err = write_plot(out / "peers.png", meta, records, names)
    if err:
        print(f"plot: {err}")
        meta["png_path"] = None
    write_json(out / "peers.json", meta, records, complete=True)
    loaded = json.loads((out / "peers.json").read_text())
    assert len(loaded["measurements"]) == len(records)
    assert {m.get("op", DEFAULT_OP) for m in loaded["measurements"]} == {args.op}
    assert any(m["rel_err"] is None and m["status"] == "WRONG" for m in loaded["measurements"]) \
        or "triton" not in names
    assert all(m["share"] is not None for m in loaded["measurements"]
               if m["suite"] != "latency" and m["status"] == "ok")
    residual = OPS[args.op].has_residual
    assert all(("h_max_abs_err" in m) == residual for m in loaded["measurements"])
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        print_summary(meta, records, names, plain=True)
    summary = text.getvalue()
    print(summary, end="")
    if any(s.suite != "latency" for s in shapes):
        for needle in ("L2 flushed by a read; copy of the same bytes", "do_bench's zeroing flush",
                       "read flush", "zero flush", "(fixed reference)",
                       f"{OPS[args.op].title}: GB/s and % of copy bandwidth"):
            assert needle in summary, needle
    if residual:
        assert "h = x + residual: largest |h - the float64 sum" in summary
        assert ("in place: inputs put back before each timed launch" in summary) == (
            any(i in IN_PLACE_IMPLS for i in names) and any(sh.suite == "latency" for sh in shapes))
    else:
        assert "h = x + residual" not in summary
    print_summary(meta, records, names, plain=args.plain)
    of = "" if args.op == DEFAULT_OP else f" of {args.op}"
    print(f"selftest ok: {len(records)} synthetic rows{of}; files in {out}")
    return 0
