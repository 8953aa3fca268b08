"""The copy yardstick: copy GB/s per buffer size and flush, and the shares taken over it.

A device-to-device copy of the same bytes, timed under the same flush in the same run, is what
every bandwidth figure is a share of (docs/timing.md).
"""

from __future__ import annotations

import functools

from . import constants
from .constants import COPY_BYTES, FLUSHES
from .failures import short_error, sync_quietly
from .shapes import Shape, gbps_of
from .timing import flushed_ms


def copy_sizes(shapes: list[Shape]) -> list[int]:
    """Copy buffer sizes to time: each bandwidth shape's ``copy_bytes`` and the fixed one."""
    return sorted({s.copy_bytes for s in shapes if s.copy_bytes is not None} | {COPY_BYTES})


def measure_copies(sizes: list[int]) -> list[dict]:
    """Time a device-to-device copy of each buffer size under each flush (adjacent in time)."""
    import torch

    out: list[dict] = []
    for nbytes in sizes:
        entries = {f: {"bytes_buffer": nbytes, "bytes_moved": 2 * nbytes, "flush": f,
                       "gbps": None} for f in FLUSHES}
        try:
            src = torch.randn(nbytes // 2, device=constants.DEVICE, dtype=torch.bfloat16)
            dst = torch.empty_like(src)
            for f in FLUSHES:
                ms, p20, p80 = flushed_ms(functools.partial(dst.copy_, src), f)
                entries[f].update(ms=ms, ms_p20=p20, ms_p80=p80, gbps=gbps_of(2 * nbytes, ms))
            torch.cuda.synchronize()
            if not torch.equal(dst, src):
                raise RuntimeError("copy result differs from its source")
        except Exception as exc:  # noqa: BLE001
            for e in entries.values():
                e.update(gbps=None, error=short_error(exc))
            sync_quietly()
        src = dst = None  # free before the next size's buffers are allocated
        out.extend(entries.values())
    return out


def copy_rates(*measurements: list[dict]) -> dict[tuple[int, str], float]:
    """(buffer bytes, flush) -> the largest copy GB/s among the given measurement lists."""
    rates: dict[tuple[int, str], float] = {}
    for entries in measurements:
        for e in entries:
            key, g = (e["bytes_buffer"], e["flush"]), e.get("gbps")
            if g and g > rates.get(key, 0.0):
                rates[key] = g
    return rates


def used_copies(start: list[dict], end: list[dict]) -> list[dict]:
    """Per size and flush: start and end GB/s and the larger, which the shares use."""
    first = {(e["bytes_buffer"], e["flush"]): e.get("gbps") for e in start}
    last = {(e["bytes_buffer"], e["flush"]): e.get("gbps") for e in end}
    used = copy_rates(start, end)
    return [{"bytes_buffer": n, "bytes_moved": 2 * n, "flush": f, "start_gbps": first.get((n, f)),
             "end_gbps": last.get((n, f)), "gbps": used.get((n, f)), "fixed": n == COPY_BYTES}
            for n, f in sorted(set(first) | set(last), key=lambda k: (k[0], FLUSHES.index(k[1])))]


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if (a and b) else None


def finalize(records: list[dict], rates: dict[tuple[int, str], float]) -> None:
    """Set the shares from copy GB/s keyed by (buffer bytes, flush), as ``copy_rates`` gives."""
    fixed_read, fixed_zero = rates.get((COPY_BYTES, "read")), rates.get((COPY_BYTES, "zero"))
    for r in records:
        if r["suite"] == "latency":
            # Timed by do_bench (zeroing flush): its share is over the fixed copy, same flush.
            r["share"] = _ratio(r["gbps"], fixed_zero)
            continue
        size = r.get("copy_bytes")
        r["share"] = _ratio(r["gbps"], rates.get((size, "read")))
        r["share_zero"] = _ratio(r.get("gbps_zero"), rates.get((size, "zero")))
        r["share_fixed_copy"] = _ratio(r["gbps"], fixed_read)
