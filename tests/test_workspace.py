"""CPU: which tile counter a launch gets (autonorm.runtime.workspace), the driver faked.

The GPU side (the kernel's use of the counter, real capture, real streams) is in
tests/test_gpu_schedule.py; here only the bookkeeping: an unknown or invalidated capture state
and a missing driver get no counter (the static schedule), every stream gets its own, the
per-thread default stream gets one per thread, and every launch being captured gets one that no
other launch gets, from pages made as they run out.
"""

from __future__ import annotations

import ctypes
import threading
from types import SimpleNamespace

import pytest

from autonorm.runtime import driver as driver_module
from autonorm.runtime import workspace


class FakeDriver:
    """cuStreamIsCapturing that answers (code, status) per stream handle."""

    def __init__(self, answers: dict[int, tuple[int, int]] | None = None) -> None:
        self.answers = answers or {}

    def cuStreamIsCapturing(self, stream, status_ref) -> int:  # noqa: ANN001, N802 - driver name
        code, status = self.answers.get(stream.value or 0, (0, 0))
        ctypes.cast(status_ref, ctypes.POINTER(ctypes.c_int))[0] = status
        return code


def fake_allocator(monkeypatch: pytest.MonkeyPatch, name: str, stride: int) -> list[int]:
    """Replace ``workspace.<name>`` by one that records the device and returns a distinct
    pointer each time (stride, 2 x stride, ...); return the record."""
    made: list[int] = []

    def allocate(device_id: int) -> SimpleNamespace:
        made.append(device_id)
        return SimpleNamespace(data=SimpleNamespace(ptr=stride * len(made)))

    monkeypatch.setattr(workspace, name, allocate)
    return made


@pytest.fixture
def allocations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Fake counters, recorded; no counter or page made before the test."""
    monkeypatch.setattr(workspace, "_COUNTERS", {})
    monkeypatch.setattr(workspace, "_OPEN_PAGE", {})
    monkeypatch.setattr(workspace, "_PAGES", [])

    def no_page(device_id: int) -> None:  # tests that want pages take the `pages` fixture
        raise RuntimeError("no pages in this test")

    monkeypatch.setattr(workspace, "new_counter_page", no_page)
    return fake_allocator(monkeypatch, "new_counter", 0x1000)


@pytest.fixture
def pages(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Fake pages of captured launches' counters, recorded."""
    return fake_allocator(monkeypatch, "new_counter_page", 0x100000)


def use_driver(monkeypatch: pytest.MonkeyPatch, driver: object) -> None:
    monkeypatch.setattr(driver_module, "driver_library", lambda: driver)


def test_no_driver_means_no_counter(monkeypatch: pytest.MonkeyPatch, allocations) -> None:  # noqa: ANN001
    use_driver(monkeypatch, None)
    assert workspace.capture_status(0x55) == -1  # unknown
    assert workspace.counter_for(0, 0x55) == 0
    assert allocations == []


@pytest.mark.parametrize(("code", "status"), [(0, 2), (900, 0), (900, 1)])
def test_invalidated_or_unknown_means_no_counter(monkeypatch, allocations, pages, code, status) -> None:  # noqa: ANN001, E501
    use_driver(monkeypatch, FakeDriver({0x55: (code, status)}))
    assert workspace.counter_for(0, 0x55) == 0
    assert allocations == [] and pages == []


def test_each_captured_launch_gets_a_counter_of_its_own(monkeypatch, allocations, pages) -> None:  # noqa: ANN001
    use_driver(monkeypatch, FakeDriver({0x55: (0, 1), 0x66: (0, 1)}))
    monkeypatch.setattr(workspace, "PAGE_COUNTERS", 3)
    got = [workspace.counter_for(0, 0x55) for _ in range(2)] + [workspace.counter_for(0, 0x66)]
    # No warm-up: the first page is made under capture. Three launches, three counters side by
    # side in it.
    assert got == [0x100000, 0x100000 + 8, 0x100000 + 16] and pages == [0]
    own = workspace.counter_for(0, 0x77)  # a stream that is not capturing: its own counter
    assert own not in got and allocations == [0] and pages == [0]  # the open page is kept
    assert workspace.counter_for(0, 0x55) == 0x200000  # the page used up: a new one
    workspace.counter_for(1, 0x77)  # another device's first stream: its first page, outside
    assert pages == [0, 0, 1]
    assert workspace.counter_for(1, 0x55) == 0x300000
    assert len(workspace._PAGES) == 3  # noqa: SLF001 - every page kept alive for its graphs


def test_no_page_means_no_counter_and_a_later_capture_tries_again(monkeypatch, allocations) -> None:  # noqa: ANN001, E501
    use_driver(monkeypatch, FakeDriver({0x55: (0, 1)}))
    calls: list[int] = []

    def failing(device_id: int) -> SimpleNamespace:
        calls.append(device_id)
        if len(calls) == 1:
            raise RuntimeError("out of memory")
        return SimpleNamespace(data=SimpleNamespace(ptr=0x100000))

    monkeypatch.setattr(workspace, "new_counter_page", failing)
    assert workspace.counter_for(0, 0x55) == 0  # the static schedule, not an error
    assert workspace.counter_for(0, 0x55) == 0x100000
    assert calls == [0, 0]


def test_each_stream_and_device_gets_one_counter(monkeypatch, allocations, pages) -> None:  # noqa: ANN001
    use_driver(monkeypatch, FakeDriver())
    a = workspace.counter_for(0, 0x55)
    assert a != 0 and workspace.counter_for(0, 0x55) == a  # cached, not allocated again
    b = workspace.counter_for(0, 0x66)
    c = workspace.counter_for(1, 0x55)
    assert len({a, b, c}) == 3
    assert allocations == [0, 0, 1]
    assert pages == [0, 1]  # each device's first page of captured counters, made outside capture


def test_per_thread_default_stream_gets_one_counter_per_thread(monkeypatch, allocations) -> None:  # noqa: ANN001
    use_driver(monkeypatch, FakeDriver())
    got: list[int] = []
    alive = threading.Barrier(3)  # all three threads live at once: their idents differ

    def ask() -> None:
        got.append(workspace.counter_for(0, 2))
        alive.wait(timeout=10)

    threads = [threading.Thread(target=ask) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got)) == 3 and 0 not in got
    # The legacy default stream (0) is one stream for every thread.
    assert len({workspace.counter_for(0, 0) for _ in range(3)}) == 1
    assert len(allocations) == 4
