"""Tile counters for the bulk-copy kernel's dynamic schedule, one per CUDA stream.

The bulk-copy kernel hands its row tiles to whichever cluster asks next through a counter in
global memory (two uint32: tiles claimed, clusters done), which the last cluster out of a launch
zeroes again (``templates/layernorm_bulk.cu.j2``). Launches that share a counter must therefore
not overlap. Work on one stream never overlaps, so each stream gets its own counter; a stream
that is capturing a CUDA graph gets none (the kernel then takes the static schedule), because a
graph may be replayed on any stream, alongside anything. Where the capture state cannot be
asked, the answer is also none: the static schedule is only slower, never wrong.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

# compiler imports this module too; neither uses the other's names at import time, and an
# import inside stream_is_capturing cost 0.3 us a query.
from autonorm import compiler

# Bytes of one counter (two uint32); exported launchers state it as <NAME>_WORKSPACE_BYTES.
COUNTER_BYTES = 8
_COUNTERS: dict[tuple[int, int, int], Any] = {}
_PER_THREAD = 2  # CU_STREAM_PER_THREAD
_LOCK = threading.Lock()
_LOCAL = threading.local()  # this thread's (c_int status, pointer to it) for the capture query


def stream_is_capturing(stream_ptr: int) -> bool:
    """Whether ``stream_ptr`` is capturing a CUDA graph (True where the driver cannot tell).

    Asked on every launch of a bulk kernel, so the ctypes objects are made once: the stream's
    ``c_void_p`` (``compiler.stream_arg``) and this thread's status cell and pointer. Building
    them per call took 1.8 us a query on the dev machine (against a no-op library).
    """
    lib = compiler.driver_library()
    if lib is None:
        return True
    cell = getattr(_LOCAL, "cell", None)
    if cell is None:
        status = ctypes.c_int(0)
        cell = _LOCAL.cell = (status, ctypes.pointer(status))
    code = lib.cuStreamIsCapturing(compiler.stream_arg(stream_ptr), cell[1])
    # A legacy-stream query while another stream captures fails: take that as capturing too.
    return code != 0 or cell[0].value != 0


def counter_for(device_id: int, stream_ptr: int) -> int:
    """Device pointer of the zeroed tile counter for launches on this stream, or 0.

    0 (no counter: the static schedule) while the stream captures a CUDA graph. The counter is
    allocated at the first launch on a stream, outside any capture, and kept for the process.
    """
    if stream_is_capturing(stream_ptr):
        return 0
    # The per-thread default stream is one handle for a different stream in every thread.
    key = (device_id, stream_ptr, threading.get_ident() if stream_ptr == _PER_THREAD else 0)
    counter = _COUNTERS.get(key)
    if counter is None:
        with _LOCK:
            counter = _COUNTERS.get(key)
            if counter is None:
                counter = _COUNTERS[key] = new_counter(device_id)
    return counter.data.ptr


def new_counter(device_id: int) -> Any:
    """Allocate a zeroed counter on GPU ``device_id`` (for a caller that owns its stream).

    The zeroing has finished when this returns, so any stream may use the counter at once.
    """
    import cupy

    with cupy.cuda.Device(device_id):
        counter = cupy.zeros(COUNTER_BYTES // 4, dtype=cupy.uint32)
        cupy.cuda.get_current_stream().synchronize()
    return counter
