"""The isolated evaluator's child process: build the evaluator, then answer requests.

:class:`autonorm.tune.isolation.IsolatedEvaluator` spawns :func:`serve` and talks to it over a
pipe. Every reply is a ``(kind, payload)`` pair; the kinds are the constants below. The child
classifies what the evaluator raised (a CUDA error or anything else) and leaves deciding what it
means to the parent.
"""

from __future__ import annotations

import os
import signal
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from autonorm.errors import LaunchError

READY = "ready"  # the evaluator is built; the payload is its copy bandwidth

OK = "ok"  # the payload is the request's answer

CUDA = "cuda"  # the evaluator raised a CUDA error: a launch failure, the context is suspect

RAISED = "raised"  # the evaluator raised anything else: a bug, reported to the caller


def serve(
    conn: Connection, factory: Callable[..., Any], args: tuple, kwargs: dict[str, Any]
) -> None:
    """Entry point of the child: build the evaluator, then answer requests until told to stop."""
    _leave_parent_group()
    try:
        evaluator = factory(*args, **kwargs)
        copy_gbps = float(getattr(evaluator, "copy_gbps", 0.0) or 0.0)
    except BaseException as exc:  # noqa: BLE001 - anything that stops the start is reported
        _send_or_exit(conn, (RAISED, _format(exc)))
        return
    try:
        _send_or_exit(conn, (READY, copy_gbps))
        while True:
            try:
                request = conn.recv()
            except (EOFError, OSError):
                return  # the parent is gone
            kind = request[0]
            if kind == "close":
                return
            if kind == "prepare":
                try:
                    evaluator.prepare(request[1])
                except Exception:  # noqa: BLE001 - evaluate() reports a config's failure
                    pass
                continue
            _send_or_exit(conn, _answer(evaluator, request))
    finally:
        close_evaluator(evaluator)


def _answer(evaluator: Any, request: tuple) -> tuple[str, Any]:
    """Run one evaluate or retime request and build its reply."""
    try:
        if request[0] == "evaluate":
            return OK, evaluator.evaluate(request[1])
        if request[0] == "retime":
            return OK, evaluator.retime(request[1], request[2])
        raise ValueError(f"unknown request {request[0]!r}")
    except Exception as exc:  # noqa: BLE001 - the parent decides what the error means
        if _is_cuda_error(exc):
            return CUDA, f"{type(exc).__name__}: {exc}"
        return RAISED, _format(exc)


def _leave_parent_group() -> None:
    """Move into a process group of our own, where the platform has them.

    A Ctrl-C in the terminal then reaches the parent only (it records the candidate as
    interrupted and kills us), instead of killing us mid-candidate, which would read as a
    failure of the candidate. Processes we start (the compile pool) inherit the group.
    """
    # Ignored signals stay ignored in the compile pool's processes too (exec keeps SIG_IGN).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "SIGTTOU"):
        # A background group that writes to a terminal set to `stty tostop` would be stopped.
        signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    if hasattr(os, "setpgid"):
        try:
            os.setpgid(0, 0)
        except OSError:
            pass  # still isolated from Ctrl-C by SIG_IGN; only the pool may outlive a kill


def _send_or_exit(conn: Connection, message: tuple) -> None:
    """Send a reply; if the parent is gone there is no one to serve, so exit quietly."""
    try:
        conn.send(message)
    except (OSError, EOFError):
        raise SystemExit(0) from None


def _is_cuda_error(exc: BaseException) -> bool:
    """True for the errors a CUDA failure raises (CuPy's, CUDA Python's, our LaunchError)."""
    if isinstance(exc, LaunchError):
        return True
    module = type(exc).__module__ or ""
    return module.split(".", 1)[0] in ("cupy", "cupy_backends", "cuda")


def _format(exc: BaseException) -> str:
    """The exception and its traceback, as text (exceptions of CuPy may not pickle)."""
    return "".join(traceback.format_exception(exc)).rstrip()


def close_evaluator(evaluator: Any) -> None:
    """Release what the evaluator holds: its own close() if any, else its compile pool."""
    close = getattr(evaluator, "close", None)
    if callable(close):
        close()
        return
    pool = getattr(evaluator, "pool", None)
    if pool is not None:
        pool.close()
