"""Tests of autonorm.tune.isolation: candidates that kill, hang or fault their worker process.

The CPU tests run the fake evaluators of ``crashing_evaluator`` in the spawned worker; the test
marked ``gpu`` makes a real kernel write to an unmapped address.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import optuna
import pytest
from crashing_evaluator import (
    BUG,
    CRASH,
    CRASH_EXIT_CODE,
    CUDA_RAISE,
    FAULT,
    FAULT_ERROR,
    FAULTY_STORE,
    GOOD,
    HANG,
    HANG_S,
    OTHER,
    STORE,
    THIRD,
    CrashingEvaluator,
    build_broken,
    build_crashing,
    build_faulting_gpu_evaluator,
    build_slow_closing,
    evaluate_and_exit_without_close,
    faulting_source,
)
from fake_evaluator import FakeEvaluator, fake_median_us, read_log
from optuna.trial import TrialState

from autonorm.errors import AutonormError
from autonorm.ops.layer_norm import codegen, rules
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.problem import Problem
from autonorm.runtime.limits import H200
from autonorm.tune.isolation import IsolatedEvaluator
from autonorm.tune.search import TuneSettings, tune
from autonorm.tune.storage import open_storage

BF16 = Problem(hidden=4096, dtype="bfloat16")
SCRIPTED = (GOOD, OTHER, THIRD, CRASH, HANG, FAULT, CUDA_RAISE, BUG)


pytestmark = pytest.mark.usefixtures("quiet_optuna")


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return tmp_path / "calls.jsonl"


def isolated(log: Path | None = None, tame: bool = False, **kwargs: Any) -> IsolatedEvaluator:
    """An IsolatedEvaluator over the crashing fake (``tame``: HANG and BUG behave)."""
    return IsolatedEvaluator(build_crashing, (str(log) if log else None, False, tame), **kwargs)


def events(log: Path, kind: str) -> list[dict]:
    return [e for e in read_log(log) if e["event"] == kind] if log.exists() else []


def gone(pid: int, wait_s: float = 5.0) -> bool:
    """True once ``pid`` no longer runs (exited, or a zombie nobody reaped yet)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def test_scripted_configs_are_valid_and_distinct():
    assert len(set(SCRIPTED)) == len(SCRIPTED)
    for config in SCRIPTED:
        assert not rules.check(config, BF16, H200), config.label()


def test_normal_run_returns_the_fakes_outcomes_unchanged(log):
    reference = FakeEvaluator()
    configs = [GOOD, OTHER, THIRD]
    with isolated(log) as evaluator:
        assert evaluator.pool is None
        assert evaluator.copy_gbps == CrashingEvaluator.copy_gbps
        pid = evaluator.pid
        evaluator.prepare(configs)
        outcomes = [evaluator.evaluate(c) for c in configs]
        timings = evaluator.retime(configs[:2], 3)
        assert evaluator.pid == pid and evaluator.restarts == 0
    assert outcomes == [reference.evaluate(c) for c in configs]
    assert all(o.ok for o in outcomes)
    assert outcomes[0].timing.median_us == fake_median_us(GOOD)
    assert timings == reference.retime(configs[:2], 3)
    assert [e["configs"] for e in events(log, "prepare")] == [[c.to_dict() for c in configs]]
    assert {e["pid"] for e in read_log(log)} == {pid}
    assert evaluator.pid is None and gone(pid)


def test_a_crash_is_a_launch_failure_and_the_next_config_runs_in_a_fresh_worker(log):
    with isolated(log) as evaluator:
        first = evaluator.pid
        evaluator.prepare([GOOD, CRASH, OTHER, THIRD])
        assert evaluator.evaluate(GOOD).ok
        crashed = evaluator.evaluate(CRASH)
        assert crashed.status == "launch" and crashed.timing is None
        assert crashed.error.startswith(
            f"worker died while evaluating {CRASH.label()}: exit code {CRASH_EXIT_CODE}"
        ), crashed.error
        assert evaluator.pid is None  # the replacement starts with the next request
        after = evaluator.evaluate(OTHER)
        second = evaluator.pid
        assert after == FakeEvaluator().evaluate(OTHER)
        assert second is not None and second != first and evaluator.restarts == 1
        assert evaluator.evaluate(GOOD).ok and evaluator.pid == second
    # The replacement was asked to compile what was prepared and is not evaluated yet.
    prepared = [(e["pid"], e["configs"]) for e in events(log, "prepare")]
    assert prepared == [
        (first, [c.to_dict() for c in (GOOD, CRASH, OTHER, THIRD)]),
        (second, [THIRD.to_dict()]),
    ]


def test_a_hang_times_out_kills_the_worker_and_its_helpers_and_recovers(log):
    with IsolatedEvaluator(build_crashing, (str(log), True), timeout_s=1.5) as evaluator:
        first = evaluator.pid
        (helper,) = events(log, "helper")
        started = time.monotonic()
        outcome = evaluator.evaluate(HANG)
        assert time.monotonic() - started < 10
        assert outcome.status == "launch"
        assert outcome.error.startswith("timed out"), outcome.error
        assert HANG.label() in outcome.error
        assert gone(first)
        # A killed worker cannot close its helpers: they die with its process group.
        assert gone(helper["pid_of_helper"])
        assert evaluator.evaluate(GOOD).ok
        assert evaluator.pid not in (None, first) and evaluator.restarts == 1


def test_a_launch_failure_is_returned_as_is_and_replaces_the_worker(log):
    with isolated(log) as evaluator:
        first = evaluator.pid
        outcome = evaluator.evaluate(FAULT)
        assert outcome.status == "launch" and outcome.error == FAULT_ERROR
        assert evaluator.evaluate(GOOD).ok
        assert evaluator.pid != first and evaluator.restarts == 1
        assert gone(first)


def test_a_cuda_error_raised_by_the_evaluator_is_a_launch_failure(log):
    with isolated(log) as evaluator:
        first = evaluator.pid
        outcome = evaluator.evaluate(CUDA_RAISE)
        assert outcome.status == "launch"
        assert outcome.error.startswith("FakeCudaError: cudaErrorLaunchFailure"), outcome.error
        assert CUDA_RAISE.label() in outcome.error
        assert evaluator.evaluate(GOOD).ok and evaluator.pid != first


def test_a_bug_in_the_evaluator_raises_instead_of_failing_the_candidate(log):
    with isolated(log) as evaluator:
        with pytest.raises(AutonormError, match="(?s)while evaluating .*TypeError: a bug"):
            evaluator.evaluate(BUG)
        assert evaluator.evaluate(GOOD).ok and evaluator.restarts == 1


def test_a_worker_that_dies_while_retiming_raises_a_clear_error(log):
    with isolated(log) as evaluator:
        with pytest.raises(AutonormError, match=f"re-timing 2 configurations: exit code "
                                                f"{CRASH_EXIT_CODE}"):
            evaluator.retime([GOOD, CRASH], 2)
        assert evaluator.retime([GOOD], 2) == FakeEvaluator().retime([GOOD], 2)
        assert evaluator.restarts == 1


def test_a_worker_that_cannot_start_raises_with_its_error():
    with pytest.raises(AutonormError, match="(?s)could not start.*no CUDA GPU here"):
        IsolatedEvaluator(build_broken, ("no CUDA GPU here",))


def test_close_is_idempotent_and_a_closed_evaluator_starts_again_when_used():
    evaluator = isolated()
    first = evaluator.pid
    evaluator.close()
    evaluator.close()
    assert evaluator.pid is None and gone(first)
    evaluator.prepare([GOOD])  # never raises, even without a worker
    assert evaluator.evaluate(GOOD).ok
    evaluator.close()


@pytest.mark.parametrize("how", ["main", "worker"])
def test_a_process_that_never_closes_its_evaluator_still_exits(log, how):
    """The CLI never closes its evaluator: exiting must stop the worker, not wait for it."""
    if how == "worker":  # as a `--workers` process of the CLI
        process = multiprocessing.get_context("spawn").Process(
            target=evaluate_and_exit_without_close, args=(str(log),)
        )
        process.start()
        process.join(30)
        if process.is_alive():
            process.kill()
            pytest.fail("a worker process with an unclosed evaluator did not exit")
        assert process.exitcode == 0
    else:
        here = Path(__file__).resolve().parent
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here), str(here.parent)])}
        code = (
            "from crashing_evaluator import evaluate_and_exit_without_close as run; "
            f"run({str(log)!r})"
        )
        subprocess.run([sys.executable, "-c", code], env=env, timeout=30, check=True)
    (evaluated,) = events(log, "evaluate")
    assert gone(evaluated["pid"])


def test_bad_timeouts_are_refused():
    with pytest.raises(ValueError, match="timeouts"):
        IsolatedEvaluator(build_crashing, timeout_s=0)


def test_tune_completes_a_study_over_crashes_and_never_retries_them(tmp_path, log):
    path = tmp_path / "s.journal"
    crashers = [CRASH, FAULT, CUDA_RAISE]
    with isolated(log, tame=True) as evaluator:  # the sampler may propose HANG or BUG
        result = tune(
            BF16, evaluator, limits=H200, storage=str(path), study_name="s",
            settings=TuneSettings(n_trials=8, batch=4, finals_top=2, finals_rounds=2),
            seeds=[GOOD, *crashers, OTHER], progress=False,
        )
        assert evaluator.restarts == len(crashers)
    assert result.evaluated == 8
    assert result.failures["launch"] == len(crashers)
    assert {name for name, count in result.failures.items() if count} <= {"launch", "invalid"}
    assert result.best is not None and result.best not in crashers
    study = optuna.load_study(study_name="s", storage=open_storage(str(path), "s"))
    failed = {
        KernelConfig.from_dict(t.params): t.user_attrs
        for t in study.get_trials(states=[TrialState.FAIL]) if "failure" in t.user_attrs
    }
    assert set(failed) == set(crashers)
    assert all(attrs["failure"] == "launch" for attrs in failed.values())
    assert failed[CRASH]["error"].startswith(f"worker died while evaluating {CRASH.label()}")

    # A second run proposes the failed configurations first: none is measured again.
    for config in crashers:
        study.enqueue_trial(config.to_dict())
    with isolated(log, tame=True) as evaluator:
        tune(
            BF16, evaluator, limits=H200, storage=str(path), study_name="s",
            settings=TuneSettings(n_trials=10, batch=4, finals_top=0), progress=False,
        )
        assert evaluator.restarts == 0
    evaluated = Counter(KernelConfig.from_dict(e["config"]) for e in events(log, "evaluate"))
    assert all(evaluated[c] == 1 for c in crashers), evaluated
    assert max(evaluated.values()) == 1 and sum(evaluated.values()) == 10


@pytest.fixture
def ctrl_c_raises():
    """SIGINT raises KeyboardInterrupt during the test, however pytest was started.

    A background job starts with SIGINT ignored, and so does every process it spawns: the test's
    Ctrl-C would do nothing, and the worker would ignore it whatever the evaluator does. The
    handler is set before the worker is spawned, so the worker starts with SIGINT's default
    action and ignores it only if the evaluator makes it.
    """
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


# How long the watcher waits for the hanging candidate to start (spawning the worker and the
# first candidate take a second or two; a loaded machine can stretch that many times). HANG
# sleeps far longer, so the candidate is still running when the interrupt comes.
WAIT_FOR_HANG_S = 120.0


def test_ctrl_c_interrupts_the_candidate_without_failing_it(tmp_path, log, ctrl_c_raises):
    """A Ctrl-C reaches the tuner, which records the trial as interrupted (retried on resume).

    The worker runs in a process group of its own and ignores SIGINT: were it killed by the
    terminal's Ctrl-C, the candidate would read as a crash, a final failure.
    """
    assert HANG_S > WAIT_FOR_HANG_S
    path = tmp_path / "s.journal"
    seen: dict[str, object] = {}

    def interrupt_while_hanging() -> None:
        deadline = time.monotonic() + WAIT_FOR_HANG_S
        while time.monotonic() < deadline:
            hanging = [e for e in events(log, "evaluate") if e["config"] == HANG.to_dict()]
            if hanging:
                pid = hanging[0]["pid"]
                seen["own_group"] = os.getpgid(pid) == pid
                os.kill(pid, signal.SIGINT)  # as if the terminal had reached it
                # A killed process is gone within this window even on a loaded machine.
                seen["survived"] = not gone(pid, wait_s=2.0)
                seen["pid"] = pid
                break
            time.sleep(0.05)
        else:
            seen["error"] = f"the hanging candidate did not start in {WAIT_FOR_HANG_S:g} s"
        os.kill(os.getpid(), signal.SIGINT)

    with isolated(log, timeout_s=HANG_S) as evaluator:
        watcher = threading.Thread(target=interrupt_while_hanging, daemon=True)
        watcher.start()
        with pytest.raises(KeyboardInterrupt):
            tune(
                BF16, evaluator, limits=H200, storage=str(path), study_name="s",
                settings=TuneSettings(n_trials=2, batch=2, finals_top=0),
                seeds=[GOOD, HANG], progress=False,
            )
        watcher.join()
        assert seen == {"own_group": True, "survived": True, "pid": seen.get("pid")}, seen
        assert evaluator.pid is None  # killed: its state was unknown
        assert gone(seen["pid"], wait_s=30.0)
    study = optuna.load_study(study_name="s", storage=open_storage(str(path), "s"))
    (hang,) = [t for t in study.trials if KernelConfig.from_dict(t.params) == HANG]
    assert hang.state == TrialState.FAIL
    assert hang.user_attrs["failure"] == "interrupted"


def test_an_interrupt_while_a_worker_is_asked_to_stop_still_kills_it(log, ctrl_c_raises):
    """Ctrl-C (or SIGTERM, taken as one) during close()'s wait for a slow worker.

    Stopping a worker asks it to close, then waits: a worker that is still compiling takes
    seconds. An interrupt in that wait must still kill the worker's group: left alive, the
    process's exit would join it (multiprocessing does) and outlast the interrupt.
    """
    evaluator = IsolatedEvaluator(build_slow_closing, (str(log), 120.0), close_timeout_s=60.0)
    pid = evaluator.pid
    assert evaluator.evaluate(GOOD).ok

    def interrupt_once_closing() -> None:
        deadline = time.monotonic() + WAIT_FOR_HANG_S
        while time.monotonic() < deadline and not events(log, "closing"):
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    watcher = threading.Thread(target=interrupt_once_closing, daemon=True)
    watcher.start()
    with pytest.raises(KeyboardInterrupt):
        evaluator.close()
    watcher.join()
    assert events(log, "closing")  # the interrupt came while the worker was closing
    assert evaluator.pid is None
    assert gone(pid, wait_s=10.0)  # killed, not left to finish its 120 s close


def test_an_interrupt_just_after_the_close_request_still_kills_the_worker(log, monkeypatch):
    """Ctrl-C landing as the request to close goes out, before the wait for the worker begins.

    The worker has the request and starts its slow close; the interrupt must still kill it.
    Raised here by the send itself, once it has sent, this is the moment a real Ctrl-C hits
    when the worker answers the request faster than the parent reaches its wait.
    """
    evaluator = IsolatedEvaluator(build_slow_closing, (str(log), 120.0), close_timeout_s=60.0)
    assert evaluator.evaluate(GOOD).ok
    pid = evaluator.pid
    assert pid is not None and Path(f"/proc/{pid}").exists()  # the worker runs
    conn = evaluator._conn
    send = conn.send

    def send_then_interrupt(message):  # noqa: ANN001, ANN202
        send(message)
        if message == ("close",):
            raise KeyboardInterrupt

    monkeypatch.setattr(conn, "send", send_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        evaluator.close()
    assert evaluator.pid is None
    assert gone(pid, wait_s=10.0)  # killed, not left to finish its 120 s close


def test_the_fault_patch_moves_exactly_the_output_store():
    """Guards the GPU test below: its kernel must really store out of bounds."""
    rendered = codegen.render(GOOD, BF16, H200)
    patched = faulting_source(rendered.source)
    assert patched.count(FAULTY_STORE) == 1 and STORE not in patched
    assert patched.replace(FAULTY_STORE, STORE) == rendered.source
    with pytest.raises(ValueError, match="exactly one"):
        faulting_source("no store here")


@pytest.mark.gpu
def test_a_faulting_kernel_is_a_launch_failure_and_the_next_config_runs_in_a_new_worker():
    problem = BF16
    bad, good = GOOD, OTHER
    with IsolatedEvaluator(build_faulting_gpu_evaluator, (problem, 1024, bad)) as evaluator:
        assert evaluator.copy_gbps > 0 and evaluator.pool is None
        first = evaluator.pid
        before = evaluator.evaluate(good)
        assert before.ok, before
        assert evaluator.pid == first
        evaluator.prepare([bad, good])
        faulted = evaluator.evaluate(bad)
        print(f"\nfaulting kernel: {faulted.error}")
        assert faulted.status == "launch", faulted
        assert faulted.timing is None and faulted.error
        assert evaluator.pid is None  # replaced: its CUDA context is unusable now
        after = evaluator.evaluate(good)
        assert after.ok, after
        assert after.max_rel_err is not None and after.max_rel_err < 8e-3
        assert after.timing.median_us > 0 and after.timing.samples > 0
        assert evaluator.pid not in (None, first) and evaluator.restarts == 1
        assert evaluator.retime([good], 2)[0].median_us > 0
