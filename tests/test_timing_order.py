"""The timers' stream starts after the work already queued on the current stream.

A stand-in CuPy records what each stream is asked to do, in order: no launch may come on the
timers' stream before it waits on an event recorded on the current stream.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from autonorm.runtime import timing


class _Log:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.streams: dict[int, str] = {}  # a stream's handle -> its name


class _Event:
    def __init__(self, log: _Log, name: str = "event") -> None:
        self.log, self.name = log, name

    def record(self, stream: Any = None) -> None:
        self.log.calls.append(("record", getattr(stream, "name", None)))

    def synchronize(self) -> None:
        pass


class _Stream:
    def __init__(self, log: _Log, name: str | None = None) -> None:
        self.log = log
        self.ptr = 1000 + len(log.streams)
        self.name = name or f"timer{self.ptr}"
        log.streams[self.ptr] = self.name

    def record(self) -> _Event:
        self.log.calls.append(("record-on", self.name))
        return _Event(self.log, f"after-{self.name}")

    def wait_event(self, event: _Event) -> None:
        self.log.calls.append(("wait", (self.name, event.name)))

    def synchronize(self) -> None:
        pass

    def __enter__(self) -> _Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class _Device:
    id = 0

    def __init__(self, *args: object) -> None:
        pass

    def __enter__(self) -> _Device:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def _fake_cupy(log: _Log) -> types.ModuleType:
    current = _Stream(log, name="current")
    cuda = types.SimpleNamespace(
        Stream=lambda non_blocking=False: _Stream(log),
        Event=lambda: _Event(log),
        get_current_stream=lambda: current,
        get_elapsed_time=lambda a, b: 1.0,  # ms: every batch takes a millisecond
        Device=_Device,
    )
    flush = types.SimpleNamespace(sum=lambda: log.calls.append(("flush", None)))
    module = types.ModuleType("cupy")
    module.cuda = cuda  # type: ignore[attr-defined]
    module.ones = lambda n, dtype=None: flush  # type: ignore[attr-defined]
    module.int32 = "int32"  # type: ignore[attr-defined]
    return module


@pytest.fixture
def log(monkeypatch: pytest.MonkeyPatch) -> _Log:
    found = _Log()
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(found))
    timing._flush_buffer.cache_clear()
    yield found
    timing._flush_buffer.cache_clear()


def _launcher(log: _Log) -> Any:
    """A launch for the timers that records the stream it was given."""

    def launch(i: int, stream_ptr: int) -> None:
        log.calls.append(("launch", log.streams[stream_ptr]))

    return launch


def _first_launch_after_wait(log: _Log) -> int:
    """Check that every launch follows the timers' wait; return the wait's place in the log."""
    kinds = [kind for kind, _ in log.calls]
    assert "launch" in kinds, log.calls
    first_launch = kinds.index("launch")
    waits = [i for i, (kind, what) in enumerate(log.calls)
             if kind == "wait" and what[1] == "after-current"]
    assert waits and waits[0] < first_launch, log.calls
    # The event it waits on was recorded on the current stream, before the wait.
    assert log.calls.index(("record-on", "current")) < waits[0]
    # Every launch went to the stream that waited.
    timer = log.calls[waits[0]][1][0]
    assert {what for kind, what in log.calls if kind == "launch"} == {timer}
    return waits[0]


def test_back_to_back_timing_waits_for_the_current_stream(log: _Log) -> None:
    result = timing.time_launches(_launcher(log), 1 << 20, 1, samples=3)
    assert result.samples == 3
    _first_launch_after_wait(log)


def test_single_launch_timing_waits_for_the_current_stream(log: _Log) -> None:
    result = timing.time_single_launches(_launcher(log), 1 << 20, 1, flush_bytes=1 << 20,
                                         samples=3)
    assert result.samples == 3
    wait = _first_launch_after_wait(log)
    # The flushes, which read a buffer filled on the current stream, come after the wait too.
    assert log.calls.index(("flush", None)) > wait
