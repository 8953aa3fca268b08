"""Evaluate candidates in a worker process, so a kernel that faults the GPU cannot end a study.

A CUDA kernel that faults (an illegal address, an illegal instruction) leaves the CUDA context of
its process unusable for good: every later launch, copy or free in that process fails too. The
tuner runs kernels nobody has run before, so :class:`IsolatedEvaluator` keeps the real evaluator
(:class:`~autonorm.tune.evaluator.GpuEvaluator` by default) in a child process and replaces the
child when a candidate kills it, runs past its time limit, or fails to launch. The tuner sees an
ordinary :class:`~autonorm.tune.search.Evaluator`: the candidate is recorded as a ``launch`` failure
(final, never measured again) and the study goes on in a fresh child. Every launch failure
replaces the child, even one that may have left the context usable (too many resources
requested): launch failures are rare, and a new child costs a few seconds.

The child is spawned (CUDA does not survive a fork), builds its evaluator from a picklable
factory (a module-level function and its arguments), and answers requests over a pipe
(:mod:`autonorm.tune.evaluator_process`). It runs
in a process group of its own, so a Ctrl-C reaches only the parent (which records the candidate
as interrupted, not failed), and killing the group also ends the compile processes it started.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Sequence
from multiprocessing import util
from multiprocessing.connection import Connection, wait
from typing import Any

from autonorm.errors import AutonormError
from autonorm.ops.base import Config, Problem
from autonorm.results import Outcome, Timing
from autonorm.tune.evaluator_process import CUDA, OK, READY, serve

__all__ = ["DEFAULT_TIMEOUT_S", "IsolatedEvaluator", "build_gpu_evaluator"]

# Compiling (NVRTC, a few seconds for the largest kernels), verifying (six launches) and timing
# (25 samples after a 30 ms warm-up) one candidate takes seconds; a minute means it hangs.
DEFAULT_TIMEOUT_S = 60.0

# Starting a worker initializes CUDA, allocates the rotated inputs and measures copy bandwidth.
DEFAULT_START_TIMEOUT_S = 300.0

# A worker asked to stop may still be finishing a compile in its pool; then it is killed.
DEFAULT_CLOSE_TIMEOUT_S = 10.0


def build_gpu_evaluator(problem: Problem, rows: int, device_id: int = 0) -> Any:
    """Build the real evaluator with its own compile pool (the default factory, run in the child).

    Args:
        problem: what the kernels compute (any registered family's problem: picklable).
        rows: rows of the timed input.
        device_id: the GPU, as the child sees it.

    Returns:
        A :class:`~autonorm.tune.evaluator.GpuEvaluator`.

    """
    from autonorm.runtime.compiler import CompilePool
    from autonorm.tune.evaluator import GpuEvaluator

    return GpuEvaluator(problem, rows, device_id=device_id, pool=CompilePool())


class _WorkerLost(Exception):
    """The worker died (the message gives its exit code) or ran past its time limit."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class IsolatedEvaluator:
    """An :class:`~autonorm.tune.search.Evaluator` that runs the real one in a replaceable child.

    :meth:`evaluate` never raises for a candidate's own failure: a child that dies, hangs past
    ``timeout_s`` or reports a launch failure (its CUDA context may be poisoned) gives
    ``Outcome("launch", ...)`` and is replaced by a new child before the next request.

    Attributes:
        copy_gbps: the copy bandwidth the first child measured (0.0 if its evaluator has none).
        pool: always None: compiling happens in the child (the CLI closes a pool if there is one).
        timeout_s: wall-clock limit of one :meth:`evaluate`.
        restarts: children started after the first one.

    Args:
        factory: picklable callable (a module-level function or class) that builds the real
            evaluator in the child as ``factory(*args, **kwargs)``.
        args: its positional arguments (picklable).
        kwargs: its keyword arguments (picklable).
        timeout_s: wall-clock limit of one :meth:`evaluate`; past it the child is killed.
        start_timeout_s: wall-clock limit for a child to build its evaluator.
        close_timeout_s: how long a child asked to stop may take before it is killed.

    Raises:
        AutonormError: the first child could not build its evaluator (e.g. no GPU); the
            message carries the child's error.

    """

    def __init__(
        self,
        factory: Callable[..., Any] = build_gpu_evaluator,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
        close_timeout_s: float = DEFAULT_CLOSE_TIMEOUT_S,
    ) -> None:
        if timeout_s <= 0 or start_timeout_s <= 0 or close_timeout_s < 0:
            raise ValueError("timeouts must be positive")
        self.factory = factory
        self.args = tuple(args)
        self.kwargs = dict(kwargs or {})
        self.timeout_s = float(timeout_s)
        self.start_timeout_s = float(start_timeout_s)
        self.close_timeout_s = float(close_timeout_s)
        self.pool = None
        self.restarts = 0
        self._context = multiprocessing.get_context("spawn")
        self._process: Any = None
        self._conn: Connection | None = None
        self._finalizer: util.Finalize | None = None
        self._started = 0
        # Prepared but not yet evaluated: a replacement child is asked to compile them again.
        self._pending: list[Config] = []
        self.copy_gbps = self._start()

    # ------------------------------------------------------------------ the Evaluator protocol

    def prepare(self, configs: Sequence[Config]) -> None:
        """Ask the child to compile ``configs`` ahead (no reply awaited; never raises)."""
        self._pending = list(configs)
        if self._conn is not None:
            self._send_quietly(("prepare", list(configs)))

    def evaluate(self, config: Config) -> Outcome:
        """Evaluate ``config`` in the child; a dead, hung or faulted child becomes a launch failure.

        Raises:
            AutonormError: no new child could be started (the GPU itself is unusable), or the
                evaluator raised something that is not a CUDA error (a bug, not the candidate).
            KeyboardInterrupt: after the child, whose state is then unknown, is killed.

        """
        if config in self._pending:
            self._pending.remove(config)
        label = config.label()
        self._ensure_worker()
        try:
            kind, payload = self._request(("evaluate", config), self.timeout_s)
        except _WorkerLost as exc:
            if exc.timed_out:
                error = f"timed out: evaluating {label} took more than {self.timeout_s:g} s"
            else:
                error = f"worker died while evaluating {label}: {exc}"
            return Outcome("launch", error=error + "; the worker was replaced")
        if kind == OK:
            outcome = payload
            if isinstance(outcome, Outcome) and outcome.status == "launch":
                self._stop()  # a fault poisons the child's CUDA context for good
            return outcome
        self._stop()
        if kind == CUDA:
            return Outcome("launch", error=f"{payload} (evaluating {label})")
        raise AutonormError(f"the evaluator raised while evaluating {label}:\n{payload}")

    def retime(self, configs: Sequence[Config], rounds: int) -> list[Timing]:
        """Re-time ``configs`` in the child (see :meth:`GpuEvaluator.retime`).

        Raises:
            AutonormError: the child died, ran past ``timeout_s`` per configuration and round,
                or raised; it is replaced before the next request.

        """
        self._ensure_worker()
        limit = self.timeout_s * max(1, len(configs)) * max(1, rounds)
        try:
            kind, payload = self._request(("retime", list(configs), rounds), limit)
        except _WorkerLost as exc:
            raise AutonormError(
                f"the evaluator worker failed while re-timing {len(configs)} configurations: "
                f"{exc}"
            ) from None
        if kind == OK:
            return payload
        self._stop()
        raise AutonormError(f"re-timing {len(configs)} configurations failed:\n{payload}")

    # ------------------------------------------------------------------ lifetime

    @property
    def pid(self) -> int | None:
        """Process id of the current child, or None when none runs (until the next request)."""
        return None if self._process is None else self._process.pid

    def close(self) -> None:
        """Stop the child (idempotent; a later request starts a new one)."""
        self._stop()

    def __enter__(self) -> IsolatedEvaluator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the child

    def _start(self) -> float:
        """Start a child and wait until its evaluator is built; return its copy bandwidth."""
        parent_conn, child_conn = self._context.Pipe()
        process = self._context.Process(
            target=serve,
            args=(child_conn, self.factory, self.args, self.kwargs),
            name="autonorm-evaluator",
        )
        process.start()
        # Only the child may hold its end: then its death reads as end-of-file here.
        child_conn.close()
        self._process, self._conn = process, parent_conn
        # A process that exits without close() joins its children first (multiprocessing's
        # exit hook, in the main process and in a worker process alike) and would wait forever
        # for this one, which waits for requests. Finalizers with a priority run before that.
        self._finalizer = util.Finalize(self, self._stop, exitpriority=100)
        if self._started:
            self.restarts += 1
        self._started += 1
        try:
            kind, payload = self._receive(self.start_timeout_s)
        except _WorkerLost as exc:
            raise AutonormError(f"the evaluator worker could not start: {exc}") from None
        except BaseException:
            self._stop(kill=True)
            raise
        if kind != READY:
            self._stop()
            raise AutonormError(f"the evaluator worker could not start:\n{payload}")
        if self._pending:
            self._send_quietly(("prepare", list(self._pending)))
        return float(payload)

    def _ensure_worker(self) -> None:
        """Start a child if there is none, or replace one that exited while idle."""
        if self._process is not None and _exited(self._process):
            self._stop()
        if self._process is None:
            self._start()

    def _request(self, message: tuple, limit_s: float) -> tuple[str, Any]:
        """Send a request and wait for its reply; the child is stopped if it is lost."""
        try:
            self._conn.send(message)  # type: ignore[union-attr]
        except OSError:
            pass  # it died while idle; _receive reports how
        try:
            return self._receive(limit_s)
        except BaseException:
            # Interrupted mid-request: the child's state is unknown, so it goes.
            self._stop(kill=True)
            raise

    def _receive(self, limit_s: float) -> tuple[str, Any]:
        """Wait up to ``limit_s`` for the child's reply.

        Raises:
            _WorkerLost: the child died (its exit code is in the message) or timed out (it is
                killed first).

        """
        process, conn = self._process, self._conn
        deadline = time.monotonic() + limit_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self._stop(kill=True)
                raise _WorkerLost(f"timed out after {limit_s:g} s", timed_out=True)
            ready = wait([conn, process.sentinel], timeout=left)
            if conn in ready:
                try:
                    return conn.recv()
                except (EOFError, OSError):
                    pass  # its end closed: it died, reported below
            elif not ready:
                continue
            raise _WorkerLost(_describe_exit(self._stop(kill=True)))

    def _send_quietly(self, message: tuple) -> None:
        try:
            self._conn.send(message)  # type: ignore[union-attr]
        except (OSError, ValueError):
            pass  # a dead child is found and replaced by the next request

    def _stop(self, *, kill: bool = False) -> int | None:
        """Stop the child (asking first unless ``kill``); return its exit code."""
        process, conn = self._process, self._conn
        if process is None:
            return None
        interrupted: BaseException | None = None
        try:
            self._process = self._conn = None
            if self._finalizer is not None:
                self._finalizer.cancel()
                self._finalizer = None
            if not kill and not _exited(process):
                try:
                    conn.send(("close",))  # type: ignore[union-attr]
                except OSError:
                    pass
                wait([process.sentinel], timeout=self.close_timeout_s)
        except BaseException as exc:  # noqa: BLE001 - re-raised once the child is gone
            # Ctrl-C or SIGTERM while asking or waiting (the request may have just gone out):
            # the child goes all the same. Left running, it would outlive this object, and the
            # process's exit would join it (multiprocessing does) for as long as it takes to
            # close.
            interrupted = exc
        # The group also holds its compile processes, which would outlive a killed child.
        _kill_group(process.pid)
        if not _exited(process):
            process.kill()
        process.join()
        code = process.exitcode
        conn.close()  # type: ignore[union-attr]
        process.close()
        if interrupted is not None:
            raise interrupted
        return code


def _exited(process: Any) -> bool:
    """True when the child has exited, without reaping it (its pid stays ours until join)."""
    return bool(wait([process.sentinel], timeout=0))


def _kill_group(pid: int) -> None:
    """SIGKILL the process group led by child ``pid``, but only while its pid is still ours.

    Without a group of its own (it died before making one) there is no such group: a process
    group is named after its leader, and a pid still in use as a group's name is never reused.
    """
    if not (hasattr(os, "killpg") and hasattr(os, "waitid")):
        return
    try:
        # WNOWAIT: look without reaping. A reaped pid could already name someone else's group.
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _describe_exit(code: int | None) -> str:
    """Say how a child ended: ``exit code 3`` or ``exit code -11 (SIGSEGV)``."""
    if code is None:
        return "exit code unknown"
    if code < 0:
        try:
            return f"exit code {code} ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return f"exit code {code}"
