"""The run's meta for the JSON: date, arguments, versions, the device and the method."""

from __future__ import annotations

import argparse
import datetime as _dt
import platform
import sys

from .constants import (
    BENCH_REP_MS,
    BENCH_WARMUP_MS,
    COPY_BYTES,
    COPY_ROUND,
    DEFAULT_OP,
    EPS,
    FLUSH_BYTES,
    FLUSH_MAX_REPS,
    FLUSH_MIN_REPS,
    GRAPH_REP_MS,
    HOST_CALLS,
    HOST_REPEATS,
    QUANTILES,
    TOL,
)
from .failures import short_error
from .ops import OPS
from .shapes import op_fields


def collect_meta(args: argparse.Namespace) -> dict:
    import torch

    op = OPS[args.op]
    copied = "x and the residual" if op.has_residual else "x"
    meta: dict = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "argv": sys.argv,
        # A LayerNorm run names no op (nor do its records): LayerNorm results keep one format.
        "args": {k: v for k, v in vars(args).items() if k != "op" or v != DEFAULT_OP},
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "eps": EPS,
        "tolerances": TOL,
        "method": {
            "bench": f"triton.testing.do_bench warmup={BENCH_WARMUP_MS} rep={BENCH_REP_MS} "
                     f"quantiles={QUANTILES} (median first; L2 flushed before each call); "
                     "latency suite only",
            "flushed": f"sweep and llm suites: single launches between CUDA events, each after "
                       f"a flush; warm-up about {BENCH_WARMUP_MS} ms, repeats covering about "
                       f"{BENCH_REP_MS} ms of kernel time ({FLUSH_MIN_REPS} to "
                       f"{FLUSH_MAX_REPS}); median, p20, p80. Each launch is timed under both "
                       "flushes, one right after the other",
            "flush_read": f"primary (ms, gbps, share): sum a {FLUSH_BYTES // 2**20} MiB int32 "
                          "buffer before each launch; inputs are evicted and the L2 holds only "
                          "clean lines, so nothing is written back during the launch",
            "flush_zero": "secondary (ms_zero, gbps_zero, share_zero): zero the same buffer, "
                          "as do_bench does; the L2 is left full of dirty lines whose write-back "
                          "lands in the timed launch, 4-6 us per launch on an H200, which weighs "
                          "more on shorter launches; kept to compare with earlier runs",
            "graph": f"triton.testing.do_bench_cudagraph rep={GRAPH_REP_MS} (L2 not flushed)",
            "host": f"wall time of {HOST_CALLS} back-to-back calls after a sync, median of "
                    f"{HOST_REPEATS}",
            "bytes": f"rows*hidden*itemsize*{op.row_streams} + {op.vectors}*hidden*itemsize",
            "share": "GB/s over the GB/s of a device-to-device copy of the same bytes as "
                     f"{copied} "
                     f"(rounded to {COPY_ROUND // 2**20} MiB; bytes moved = 2 x buffer), timed "
                     "under the same flush in the same run (larger of start and end). Latency "
                     f"suite: over the fixed {COPY_BYTES // 2**20} MiB copy, zeroing flush",
            "share_zero": "gbps_zero over the zeroing-flush copy of the same bytes",
            "share_fixed_copy": f"gbps (read flush) over the read-flush copy of the fixed "
                                f"{COPY_BYTES // 2**20} MiB buffer, the yardstick of earlier runs",
        },
    }
    meta.update(op_fields(args.op))
    try:
        import triton

        meta["triton"] = triton.__version__
    except Exception as exc:  # noqa: BLE001
        meta["triton"] = f"unavailable: {short_error(exc)}"
    try:
        import cupy

        meta["cupy"] = cupy.__version__
    except Exception:  # noqa: BLE001
        meta["cupy"] = None
    try:
        props = torch.cuda.get_device_properties(0)
        meta["device"] = props.name
        meta["capability"] = f"{props.major}.{props.minor}"
        meta["sm_count"] = props.multi_processor_count
        meta["memory_gib"] = round(props.total_memory / 2**30, 1)
        meta["l2_bytes"] = getattr(props, "L2_cache_size", None)
    except Exception as exc:  # noqa: BLE001
        meta["device"] = f"? ({short_error(exc)})"
    return meta
