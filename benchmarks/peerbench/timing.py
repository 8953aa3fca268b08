"""Timing: do_bench, CUDA-graph replay, host time, and single launches after an L2 flush."""

from __future__ import annotations

import functools
import inspect
import math
import statistics
import time

from . import constants
from .constants import (
    BENCH_REP_MS,
    BENCH_WARMUP_MS,
    FLUSH_BYTES,
    FLUSH_MAX_REPS,
    FLUSH_MIN_REPS,
    GRAPH_REP_MS,
    HOST_CALLS,
    HOST_REPEATS,
    QUANTILES,
)


def call_bench(bench_fn, fn, **kw) -> tuple[float, float | None, float | None]:
    """Median (and 20th/80th percentiles where the API gives them) in ms."""
    params = inspect.signature(bench_fn).parameters
    if "quantiles" in params:
        r = bench_fn(fn, quantiles=QUANTILES, **kw)
        if isinstance(r, (list, tuple)):
            return float(r[0]), float(r[1]), float(r[2])
        return float(r), None, None
    if "return_mode" in params:
        return float(bench_fn(fn, return_mode="median", **kw)), None, None
    r = bench_fn(fn, **kw)
    return (float(r[0]), None, None) if isinstance(r, (list, tuple)) else (float(r), None, None)


def bench_ms(fn):
    from triton.testing import do_bench

    return call_bench(do_bench, fn, warmup=BENCH_WARMUP_MS, rep=BENCH_REP_MS)


def graph_ms(fn, rep_ms: int = GRAPH_REP_MS):
    """CUDA-graph replay time of ``fn`` (``do_bench_cudagraph``, L2 not flushed), in ms."""
    import torch
    from triton.testing import do_bench_cudagraph

    torch.cuda.synchronize()
    return call_bench(do_bench_cudagraph, fn, rep=rep_ms)


def host_us(fn) -> float:
    """Host-inclusive latency: wall time of back-to-back calls over their number."""
    import torch

    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(HOST_REPEATS):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(HOST_CALLS):
            fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) / HOST_CALLS)
    return statistics.median(samples) * 1e6


@functools.cache
def _flush_buffer():
    """The flush buffer, allocated once: a fresh 256 MB allocation per measurement would cost
    time and could fail late in a run when memory is fragmented."""
    import torch

    return torch.zeros(FLUSH_BYTES // 4, dtype=torch.int32, device=constants.DEVICE)


def flush_launch(kind: str):
    """Return the callable run before each timed launch: ``read`` or ``zero`` (see FLUSHES)."""
    buf = _flush_buffer()
    if kind == "read":
        # Evicts the inputs and leaves only clean lines: nothing to write back in the launch.
        return lambda: buf.sum()
    if kind == "zero":
        # do_bench's flush: the L2 is left full of dirty lines, written back during the launch.
        return buf.zero_
    raise ValueError(f"unknown flush {kind!r}")


def rep_count(est_ms: float, budget_ms: float) -> int:
    """Repeats covering about ``budget_ms`` of kernel time, within the min and max reps."""
    if not est_ms > 0:
        return FLUSH_MAX_REPS
    return min(FLUSH_MAX_REPS, max(FLUSH_MIN_REPS, math.ceil(budget_ms / est_ms)))


def summarize_ms(times: list[float]) -> tuple[float, float, float]:
    """Median, 20th and 80th percentiles (linear interpolation, as torch.quantile)."""
    s = sorted(times)
    if not s:
        raise ValueError("no samples")

    def q(p: float) -> float:
        pos = p * (len(s) - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (pos - lo)

    return q(0.5), q(0.2), q(0.8)


def flushed_ms(fn, flush: str, restore=None) -> tuple[float, float, float]:
    """Time single launches of ``fn``, each after a flush of the L2; (median, p20, p80) in ms.

    Args:
        fn: the launch to time (already called once, so compiled and loaded).
        flush: ``"read"`` or ``"zero"``, see ``flush_launch``.
        restore: called before each timed launch's flush, or None: puts back the inputs an
            in-place form overwrote, so every timed launch runs on the inputs that were checked
            (the flush then evicts what it wrote, before the start event).

    Returns:
        Median, 20th and 80th percentile of the per-launch event times, in ms.
    """
    import torch

    pre = flush_launch(flush)

    def events(n: int) -> list:
        return [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                for _ in range(n)]

    def timed(pairs: list) -> None:
        for a, b in pairs:
            if restore is not None:
                restore()
            pre()
            a.record()
            fn()
            b.record()

    fn()
    torch.cuda.synchronize()
    est = events(5)
    timed(est)
    torch.cuda.synchronize()
    est_ms = statistics.median(a.elapsed_time(b) for a, b in est)
    # Warm-up without a sync after it: the GPU is still busy with it while the host queues the
    # timed launches, so no launch waits on the host between its start event and the kernel.
    for _ in range(min(FLUSH_MAX_REPS, max(3, math.ceil(BENCH_WARMUP_MS / max(est_ms, 1e-3))))):
        fn()
    pairs = events(rep_count(est_ms, BENCH_REP_MS))
    timed(pairs)
    torch.cuda.synchronize()
    return summarize_ms([a.elapsed_time(b) for a, b in pairs])
