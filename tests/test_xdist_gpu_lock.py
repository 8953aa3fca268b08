"""Tests marked `gpu` run one at a time under pytest-xdist (tests/conftest.py's lock). No GPU."""

from __future__ import annotations

import fcntl
import uuid
from types import SimpleNamespace

import conftest
import pytest


def item(keywords: set[str], run: str | None) -> SimpleNamespace:
    """A test item as the hook sees it: its marks and, under xdist, its worker's input."""
    config = SimpleNamespace() if run is None else SimpleNamespace(workerinput={"testrunuid": run})
    return SimpleNamespace(keywords=keywords, config=config)


def held_elsewhere(run: str) -> bool:
    """Whether another holder has the run's lock (a second open file cannot take it)."""
    lock = conftest.gpu_lock_path(run)
    if not lock.exists():
        return False
    with open(lock, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False


@pytest.mark.parametrize(("keywords", "xdist", "locks"), [
    ({"gpu"}, True, True),
    (set(), True, False),
    ({"gpu"}, False, False),
])
def test_a_gpu_test_holds_the_runs_lock_under_xdist_only(keywords, xdist, locks):
    run = uuid.uuid4().hex
    protocol = conftest.pytest_runtest_protocol(item(keywords, run if xdist else None), None)
    next(protocol)  # the test runs here
    assert held_elsewhere(run) == locks
    with pytest.raises(StopIteration):
        protocol.send(True)
    assert not held_elsewhere(run)
    conftest.gpu_lock_path(run).unlink(missing_ok=True)
