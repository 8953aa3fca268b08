"""A request to terminate (SIGTERM) ends tuning as Ctrl-C does: what finished is kept, the
command says so in one line, and the handler of before comes back. No GPU: a fake H200 and the
fake evaluator."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner
from fake_evaluator import FakeEvaluator

from autonorm import cli
from autonorm.cli_messages import INTERRUPTED
from autonorm.runtime.device import DeviceInfo
from autonorm.store.db import TuningDB
from autonorm.tune.interrupt import terminate_as_interrupt

H200 = DeviceInfo(name="NVIDIA H200", cc=90, sm_count=132, l2_bytes=62914560,
                  smem_optin=232448, mem_bus_bits=6016, mem_clock_khz=3201000)


def db_winners(path: Path) -> list:
    with TuningDB(path) as db:
        return db.winners()


class Terminated(Exception):
    """What SIGTERM raises in these tests outside autonorm's blocks (never a dead pytest)."""


@pytest.fixture
def guarded():
    """SIGTERM raises Terminated for the test, so a handler left unset cannot kill pytest."""
    def terminated(signum, frame):  # noqa: ANN001, ANN202, ARG001
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield terminated
    finally:
        signal.signal(signal.SIGTERM, previous)


class TerminatedEvaluator(FakeEvaluator):
    """The fake evaluator, sent SIGTERM (as `kill` or `timeout` would) at its third candidate."""

    def _evaluate(self, config):  # noqa: ANN001, ANN202
        if len(self.calls) == 2:
            self.calls.append(config)
            os.kill(os.getpid(), signal.SIGTERM)
        return super()._evaluate(config)


def test_sigterm_interrupts_tune_and_keeps_its_trials(guarded, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import autonorm.runtime.device
    from autonorm.tune import session

    monkeypatch.setenv("AUTONORM_DB", str(tmp_path / "user.db"))
    monkeypatch.setenv("AUTONORM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(autonorm.runtime.device, "query_device", lambda device_id=None: H200)
    evaluator = TerminatedEvaluator()
    monkeypatch.setattr(session, "_build_evaluator", lambda *args: evaluator)
    result = CliRunner().invoke(cli.main, ["tune", "--hidden", "4096", "--trials", "8",
                                           "--rows", "1000"])
    assert result.exit_code == INTERRUPTED, result.output
    assert not isinstance(result.exception, Terminated)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors == ["error: interrupted: finished trials are kept; run the same command to "
                      "resume"], result.stderr
    assert len(evaluator.calls) == 3  # stopped at the candidate it was measuring
    with TuningDB(tmp_path / "user.db") as db:
        statuses = [t["status"] for t in db.trials()]
    assert statuses[:2] == ["ok", "ok"] and "ok" not in statuses[2:], statuses
    assert not db_winners(tmp_path / "user.db")  # interrupted before its finals: no winner
    # the test's own handler is back
    assert signal.getsignal(signal.SIGTERM) is guarded


def test_the_handler_raises_only_inside_the_block(guarded) -> None:
    with pytest.raises(KeyboardInterrupt), terminate_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is guarded
    with pytest.raises(Terminated):
        os.kill(os.getpid(), signal.SIGTERM)


def test_outside_the_main_thread_the_block_changes_nothing(guarded) -> None:
    seen = []

    def run() -> None:
        with terminate_as_interrupt():
            seen.append(signal.getsignal(signal.SIGTERM))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen == [guarded]


def test_a_killed_process_exits_as_interrupted() -> None:
    # In a process of its own, as `timeout` sends it: the block's KeyboardInterrupt ends it.
    code = ("import os, signal, sys\n"
            "from autonorm.tune.interrupt import terminate_as_interrupt\n"
            "try:\n"
            "    with terminate_as_interrupt():\n"
            "        os.kill(os.getpid(), signal.SIGTERM)\n"
            "        signal.pause()\n"
            "except KeyboardInterrupt:\n"
            "    sys.exit(130)\n")
    proc = subprocess.run([sys.executable, "-c", code], timeout=60, capture_output=True)
    assert proc.returncode == 130, proc.stderr
