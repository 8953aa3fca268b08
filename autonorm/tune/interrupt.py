"""A request to terminate (SIGTERM: ``kill``, ``timeout``, a batch scheduler) taken as Ctrl-C.

Tuning keeps what it finished when interrupted: the search records the candidate it was
measuring as interrupted, stops its evaluator process and that process's compile pool, and the
command line says so in one line. SIGTERM's default ends the process at once instead: the
evaluator and its compilers, which sit in a process group of their own (away from the terminal's
Ctrl-C), go on running, and a pipe that reads the command's output (``timeout 600 autonorm tune
... | tee log``) stays open until they end. :func:`terminate_as_interrupt` raises
``KeyboardInterrupt`` on SIGTERM for the length of a block, so both end the same way.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType


def _interrupt(signum: int, frame: FrameType | None) -> None:  # noqa: ARG001
    raise KeyboardInterrupt


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Raise ``KeyboardInterrupt`` in the main thread on SIGTERM inside the block.

    The previous handler comes back on leaving it. Outside the main thread (where Python sets
    no signal handlers) the block runs as it is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
