"""Tile counters for the bulk-copy kernel's dynamic schedule: per stream, and per captured launch.

The bulk-copy kernel hands its row tiles to whichever cluster asks next through a counter in
global memory (two uint32: tiles claimed, clusters done), which the last cluster out of a launch
zeroes again (docs/bulk-kernel.md). Launches that share a counter must therefore not overlap.
Any kernel whose parameter list ends with a workspace (``KernelABI.workspace``) gets its counter
from here.

- Work on one stream never overlaps, so each stream gets its own counter.
- A launch captured into a CUDA graph gets a counter of its own, taken from a zeroed page and
  never handed out again: a graph may be replayed on any stream, alongside anything, but CUDA
  orders each replay of one instantiated graph behind the previous one, and every replay leaves
  the counter zeroed for the next. The counter lives as long as the process (8 bytes a captured
  launch), because nothing tells autonorm when the graph is destroyed. A captured launch with
  the static schedule instead runs 2-7% slower at the bulk kernel's sizes on an H200
  (docs/bulk-kernel.md).
- Where the capture state cannot be asked, or a page cannot be had, the answer is none (0):
  the kernel then takes the static schedule, which is only slower, never wrong.

One hazard stays with the caller, as for any buffer a graph captures: two instantiations of one
graph (or two copies of it inside another graph) that run at the same time share its counters.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

# The ctypes binding lives in driver, which imports neither this module nor compiler; an
# import inside the capture query cost 0.3 us a query.
from autonorm.runtime import driver

# Bytes of one counter (two uint32); exported launchers state it as <NAME>_WORKSPACE_BYTES.
COUNTER_BYTES = 8

# Counters in one page of captured launches' counters (32 KiB).
PAGE_COUNTERS = 4096

_COUNTERS: dict[tuple[int, int, int], Any] = {}

_PER_THREAD = 2  # CU_STREAM_PER_THREAD

_CAPTURE_ACTIVE = 1  # CU_STREAM_CAPTURE_STATUS_ACTIVE

_CAPTURE_MODE_RELAXED = 2  # CU_STREAM_CAPTURE_MODE_RELAXED

_LOCK = threading.Lock()

_LOCAL = threading.local()  # this thread's (c_int status, pointer to it) for the capture query

# Captured launches' counters: every page ever made (kept alive for the graphs that use them),
# and per device the page being handed out and the number of its counters already taken.
_PAGES: list[Any] = []

_OPEN_PAGE: dict[int, tuple[int, int]] = {}


def capture_status(stream_ptr: int) -> int:
    """The stream's ``CUstreamCaptureStatus`` (0 none, 1 active, 2 invalidated), -1 if unknown.

    Asked on every launch of a bulk kernel, so the ctypes objects are made once: the stream's
    ``c_void_p`` (``driver.stream_arg``) and this thread's status cell and pointer. Building
    them per call took 1.8 us a query (timed against a no-op library).
    """
    lib = driver.driver_library()
    if lib is None:
        return -1
    cell = getattr(_LOCAL, "cell", None)
    if cell is None:
        status = ctypes.c_int(0)
        cell = _LOCAL.cell = (status, ctypes.pointer(status))
    code = lib.cuStreamIsCapturing(driver.stream_arg(stream_ptr), cell[1])
    # A legacy-stream query while another stream captures fails: unknown.
    return cell[0].value if code == 0 else -1


def counter_for(device_id: int, stream_ptr: int) -> int:
    """Device pointer of a zeroed tile counter for a launch on this stream, or 0.

    A stream's launches share the stream's counter, allocated at its first launch and kept for
    the process. A launch being captured into a CUDA graph gets one of its own
    (:func:`graph_counter`). 0 (no counter: the static schedule) where the capture state is
    unknown or the capture was invalidated.
    """
    status = capture_status(stream_ptr)
    if status == _CAPTURE_ACTIVE:
        return graph_counter(device_id)
    if status != 0:
        return 0
    # The per-thread default stream is one handle for a different stream in every thread.
    key = (device_id, stream_ptr, threading.get_ident() if stream_ptr == _PER_THREAD else 0)
    counter = _COUNTERS.get(key)
    if counter is None:
        with _LOCK:
            counter = _COUNTERS.get(key)
            if counter is None:
                counter = _COUNTERS[key] = new_counter(device_id)
                # The device's first page of captured launches' counters too, while this stream
                # does not capture (a warm-up before a capture comes here): then a page is made
                # under capture only after PAGE_COUNTERS captured launches, or with no warm-up.
                if device_id not in _OPEN_PAGE:
                    _open_page(device_id)
    return counter.data.ptr


def graph_counter(device_id: int) -> int:
    """A zeroed counter no other launch gets, for a launch being captured; 0 if none can be had.

    Taken from a page of ``PAGE_COUNTERS`` zeroed counters; a new page is made when the open one
    is used up (:func:`new_counter_page`, which steps outside the capture to do it).
    """
    with _LOCK:
        base, taken = _OPEN_PAGE.get(device_id, (0, PAGE_COUNTERS))
        if taken == PAGE_COUNTERS:
            if not _open_page(device_id):
                return 0
            base, taken = _OPEN_PAGE[device_id]
        _OPEN_PAGE[device_id] = (base, taken + 1)
    return base + taken * COUNTER_BYTES


def _open_page(device_id: int) -> bool:
    """Make a new page the device's open one (``_LOCK`` held); False if it cannot be made."""
    try:
        page = new_counter_page(device_id)
    except Exception:  # noqa: BLE001 - any failure leaves the static schedule
        return False
    _PAGES.append(page)
    _OPEN_PAGE[device_id] = (page.data.ptr, 0)
    return True


def new_counter(device_id: int) -> Any:
    """Allocate a zeroed counter on GPU ``device_id`` (for a caller that owns its stream).

    The zeroing has finished when this returns, so any stream may use the counter at once.
    """
    import cupy

    with cupy.cuda.Device(device_id):
        counter = cupy.zeros(COUNTER_BYTES // 4, dtype=cupy.uint32)
        cupy.cuda.get_current_stream().synchronize()
    return counter


def new_counter_page(device_id: int) -> Any:
    """Allocate ``PAGE_COUNTERS`` zeroed counters on GPU ``device_id``, even while capturing.

    Called while some stream captures a graph: this thread's capture mode is set to relaxed
    for the allocation (as PyTorch's allocator does for its own), and the zeroing runs and is
    waited for on a private stream, so nothing here enters the graph. Raises on any failure.
    """
    import cupy

    lib = driver.driver_library()
    if lib is None:
        raise RuntimeError("the CUDA driver library cannot be loaded")
    mode = ctypes.c_int(_CAPTURE_MODE_RELAXED)
    code = lib.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode))
    if code != 0:
        raise RuntimeError(f"cuThreadExchangeStreamCaptureMode failed: CUresult {code}")
    try:
        with cupy.cuda.Device(device_id):
            stream = cupy.cuda.Stream(non_blocking=True)
            with stream:
                page = cupy.zeros(PAGE_COUNTERS * COUNTER_BYTES // 4, dtype=cupy.uint32)
            stream.synchronize()
    finally:
        lib.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode))  # the previous mode back
    return page
