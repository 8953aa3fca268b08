"""CPU tests of tuning on first use (autonorm.tune.first_use, through autonorm.dispatch).

The device query is an H200's properties, compiling returns a stand-in, and the search's
evaluator is the fake one (tests/fake_evaluator.py), so dispatch's whole path runs on temporary
user databases without a GPU: in this process and in child processes that share the database.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from fake_evaluator import FakeEvaluator, log_line, read_log

import autonorm
from autonorm import dispatch, lookup, settings
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.family import FAMILY
from autonorm.ops.layer_norm.problem import Problem
from autonorm.runtime.device import DeviceInfo
from autonorm.store.db import TuningDB, TuningKey
from autonorm.tune import first_use, session

TESTS = Path(__file__).resolve().parent
H200 = DeviceInfo(name="NVIDIA H200", cc=90, sm_count=132, l2_bytes=62914560,
                  smem_optin=232448, mem_bus_bits=6016, mem_clock_khz=3201000)
PROBLEM = Problem(4096, "bfloat16")
OTHER = Problem(2048, "float16")
ROWS = 1000  # bucket 1024
BUDGET_S = 10.0
CONFIG = KernelConfig(256, 8, 2, "registers", "two_pass", 1, 0)
KEY = TuningKey.for_problem(H200.fingerprint, PROBLEM, ROWS)


def _compiled(rendered: Any, device_id: int = 0) -> tuple[str, str]:
    """Stands in for a compiled kernel: what compile_kernel was given."""
    return ("compiled", rendered.source)


def install_fakes(patch: Any) -> None:
    """Fake the GPU for dispatch: an H200's properties and a compiler that compiles nothing."""
    import autonorm.runtime.compiler
    import autonorm.runtime.device

    patch(autonorm.runtime.device, "query_device", lambda device_id=None: H200)
    patch(autonorm.runtime.compiler, "compile_kernel", _compiled)


class Tunes:
    """Counts the searches started and gives each a fake evaluator built from ``options``."""

    def __init__(self) -> None:
        self.evaluators: list[FakeEvaluator] = []
        self.options: dict[str, Any] = {}
        self.error: Exception | None = None
        self.real = session.tune_and_store

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        evaluator = FakeEvaluator(**self.options)
        self.evaluators.append(evaluator)
        if self.error is not None:
            raise self.error
        return self.real(*args, evaluator_factory=lambda p, r: evaluator, **kwargs)


@pytest.fixture
def env(tmp_path, monkeypatch) -> Path:
    """Empty user database and cache in tmp_path, no shipped database, the setting off."""
    monkeypatch.setenv("AUTONORM_DB", str(tmp_path / "user.db"))
    monkeypatch.setenv("AUTONORM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("AUTONORM_NO_SHIPPED_DB", "1")
    for name in ("AUTONORM_TUNE_ON_FIRST_USE", "AUTONORM_FIRST_USE_BUDGET_S",
                 "AUTONORM_NO_KEEP_X"):
        monkeypatch.delenv(name, raising=False)
    install_fakes(monkeypatch.setattr)
    monkeypatch.setattr(first_use, "_OVERRIDE", None)
    monkeypatch.setattr(first_use, "_ATTEMPTED", set())
    monkeypatch.setattr(first_use, "_SAID", set())
    dispatch.clear_cache()
    yield tmp_path / "user.db"
    dispatch.clear_cache()


@pytest.fixture
def tunes(monkeypatch) -> Tunes:
    counter = Tunes()
    monkeypatch.setattr(session, "tune_and_store", counter)
    return counter


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("autonorm: ")]


def trial_count(db_path: Path) -> int:
    with TuningDB(db_path) as db:
        return len(db.trials())


def put_winner(db_path: Path, config: KernelConfig, rows: int = ROWS) -> None:
    with TuningDB(db_path) as db:
        key = TuningKey.for_problem(H200.fingerprint, PROBLEM, rows)
        db.set_winner(key, config.to_dict(), {"median_us": 10.0},
                      lookup.kernel_of(config, PROBLEM, H200.limits()))


# --------------------------------------------------------------------------- the setting


def test_off_by_default_nothing_is_tuned(env, tunes, capsys):
    kernel = dispatch.get_kernel(PROBLEM, ROWS)
    assert kernel[0] == "compiled"
    assert dispatch.chosen(PROBLEM, ROWS).source == "default"
    assert tunes.evaluators == [] and not env.exists()
    assert lines(capsys.readouterr().err) == []


def test_the_environment_turns_it_on_and_python_overrides_it(env, tunes, monkeypatch):
    monkeypatch.setenv("AUTONORM_TUNE_ON_FIRST_USE", "0")
    assert first_use._enabled() is False
    monkeypatch.setenv("AUTONORM_TUNE_ON_FIRST_USE", "1")
    assert first_use._enabled() is True
    autonorm.tune_on_first_use(False)
    assert first_use._enabled() is False
    dispatch.get_kernel(PROBLEM, ROWS)
    assert tunes.evaluators == []


def test_the_budget_is_read_bounded_and_checked(env, monkeypatch):
    assert settings.first_use_budget_s() == 15.0
    for text, seconds in (("20", 20.0), ("1000", 300.0), ("0.1", 1.0)):
        monkeypatch.setenv("AUTONORM_FIRST_USE_BUDGET_S", text)
        assert settings.first_use_budget_s() == seconds
    monkeypatch.setenv("AUTONORM_FIRST_USE_BUDGET_S", "soon")
    with pytest.raises(ValueError, match="AUTONORM_FIRST_USE_BUDGET_S"):
        settings.first_use_budget_s()
    assert first_use._budget_s() == 15.0  # said once on stderr, and the default used
    autonorm.tune_on_first_use(True, budget_s=5)
    assert first_use._budget_s() == 5.0
    tuned = first_use.search_settings(15.0)
    assert tuned.timeout_s < 15.0 and tuned.n_trials >= first_use.MIN_TRIALS


@pytest.mark.parametrize(("kwargs", "error", "name"), [
    ({"enabled": "yes"}, TypeError, "enabled"),
    ({"budget_s": 0}, ValueError, "budget_s"),
    ({"budget_s": 301.0}, ValueError, "budget_s"),
    ({"budget_s": float("nan")}, ValueError, "budget_s"),
    ({"budget_s": "15"}, ValueError, "budget_s"),
])
def test_bad_arguments_are_refused_naming_them(env, kwargs, error, name):
    with pytest.raises(error, match=name):
        autonorm.tune_on_first_use(**kwargs)
    assert first_use._OVERRIDE is None


# --------------------------------------------------------------------------- tuning


def test_the_first_call_tunes_and_stores_once(env, tunes, capsys):
    autonorm.tune_on_first_use(True, budget_s=BUDGET_S)
    kernel = dispatch.get_kernel(PROBLEM, ROWS)
    choice = dispatch.chosen(PROBLEM, ROWS)
    assert choice.source == "user"
    assert len(tunes.evaluators) == 1
    (evaluator,) = tunes.evaluators
    default = FAMILY.default(PROBLEM, H200.limits())
    assert evaluator.calls[0] == default  # the choice it had is measured first
    with TuningDB(env) as db:
        winner = db.get_winner(KEY)
    assert winner is not None and winner.config == choice.config.to_dict()
    assert kernel == _compiled(FAMILY.render(choice.config, PROBLEM, H200.limits()))
    start, end = lines(capsys.readouterr().err)
    assert "hidden 4096" in start and "1024" in start and f"{BUDGET_S:g} s" in start
    assert choice.config.label() in end and "source user" in end and str(env) in end
    trials = trial_count(env)
    # The same process after its cache is cleared, at another row count of the bucket: the
    # stored winner is found, nothing is tuned again.
    dispatch.clear_cache()
    assert dispatch.get_kernel(PROBLEM, ROWS + 24) == kernel
    assert len(tunes.evaluators) == 1 and trial_count(env) == trials
    assert lines(capsys.readouterr().err) == []


def test_a_winner_of_another_bucket_does_not_count(env, tunes):
    put_winner(env, CONFIG, rows=ROWS * 8)
    autonorm.tune_on_first_use(True, budget_s=BUDGET_S)
    assert dispatch.choose_config(PROBLEM, ROWS).source == "user-nearest"
    dispatch.get_kernel(PROBLEM, ROWS)
    assert len(tunes.evaluators) == 1
    assert tunes.evaluators[0].calls[0] == CONFIG  # the nearest bucket's winner, measured first
    assert dispatch.chosen(PROBLEM, ROWS).source == "user"


def test_an_exact_winner_is_used_without_tuning(env, tunes):
    put_winner(env, CONFIG)
    autonorm.tune_on_first_use(True, budget_s=BUDGET_S)
    dispatch.get_kernel(PROBLEM, ROWS)
    assert dispatch.chosen(PROBLEM, ROWS) == lookup.Choice(CONFIG, "user")
    assert tunes.evaluators == []


# --------------------------------------------------------------------------- other processes


def child(log: str, sleep_s: float) -> None:
    """A process's first call: fakes as in this module, each search logged to ``log``."""
    import autonorm.tune.session

    install_fakes(setattr)
    real = autonorm.tune.session.tune_and_store

    def logged(*args: Any, **kwargs: Any) -> Any:
        log_line(Path(log), {"event": "tune"})
        factory = lambda p, r: FakeEvaluator(sleep_s=sleep_s)  # noqa: E731
        return real(*args, evaluator_factory=factory, **kwargs)

    autonorm.tune.session.tune_and_store = logged
    dispatch.get_kernel(PROBLEM, ROWS)
    choice = dispatch.chosen(PROBLEM, ROWS)
    print(json.dumps([choice.source, choice.config.label()]))


def start_child(log: Path, sleep_s: float = 0.0) -> subprocess.Popen:
    code = (f"import sys; sys.path.insert(0, {str(TESTS)!r}); import test_first_use; "
            f"test_first_use.child({str(log)!r}, {sleep_s})")
    env = {**os.environ, "AUTONORM_TUNE_ON_FIRST_USE": "1",
           "AUTONORM_FIRST_USE_BUDGET_S": str(BUDGET_S)}
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> tuple[list[str], str]:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1]), err


def test_another_process_finds_the_winner_without_tuning(env, tunes, tmp_path):
    autonorm.tune_on_first_use(True, budget_s=BUDGET_S)
    dispatch.get_kernel(PROBLEM, ROWS)
    label = dispatch.chosen(PROBLEM, ROWS).config.label()
    trials = trial_count(env)
    log = tmp_path / "tunes.jsonl"
    (source, found), err = finish(start_child(log))
    assert (source, found) == ("user", label)
    assert not log.exists() and trial_count(env) == trials
    assert lines(err) == []


def test_two_processes_starting_at_once_tune_once(env, tmp_path):
    log = tmp_path / "tunes.jsonl"
    procs = [start_child(log, sleep_s=0.05) for _ in range(2)]
    results = [finish(proc) for proc in procs]
    assert [e["event"] for e in read_log(log)] == ["tune"]
    (first, _), (second, _) = results
    assert first == second and first[0] == "user"
    with TuningDB(env) as db:
        assert FAMILY.config_from_dict(db.get_winner(KEY).config).label() == first[1]
    assert sum("tuning it within" in line for _, err in results for line in lines(err)) == 1


def hold_lock() -> int:
    """Take the lock of (user DB, H200, PROBLEM, ROWS) as another process would."""
    path = first_use._lock_path(settings.user_db_path(), H200, PROBLEM, ROWS)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def test_a_waiting_call_takes_the_winner_stored_meanwhile(env, tunes, monkeypatch):
    autonorm.tune_on_first_use(True, budget_s=BUDGET_S)
    said: list[str] = []
    waiting = threading.Event()

    def say(message: str) -> None:
        said.append(message)
        if "waiting" in message:
            waiting.set()

    monkeypatch.setattr(first_use, "_say", say)
    fd = hold_lock()
    caller = threading.Thread(target=dispatch.get_kernel, args=(PROBLEM, ROWS))
    try:
        caller.start()
        assert waiting.wait(timeout=120), said
        put_winner(env, CONFIG)  # what the process holding the lock stores
    finally:
        os.close(fd)
    caller.join(timeout=120)
    assert not caller.is_alive()
    assert dispatch.chosen(PROBLEM, ROWS) == lookup.Choice(CONFIG, "user")
    assert tunes.evaluators == []
    assert CONFIG.label() in said[-1]


def test_a_call_that_waits_too_long_keeps_its_choice(env, tunes, monkeypatch, capsys):
    autonorm.tune_on_first_use(True, budget_s=BUDGET_S)
    monkeypatch.setattr(first_use, "wait_limit_s", lambda budget_s: 0.2)
    fd = hold_lock()
    try:
        dispatch.get_kernel(PROBLEM, ROWS)
    finally:
        os.close(fd)
    assert dispatch.chosen(PROBLEM, ROWS).source == "default"
    assert tunes.evaluators == []
    waited, gave_up = lines(capsys.readouterr().err)
    assert "waiting" in waited and "still being tuned" in gave_up


# --------------------------------------------------------------------------- when not to tune


def test_no_tuning_while_a_graph_is_captured(env, tunes, monkeypatch, capsys):
    autonorm.tune_on_first_use(True, budget_s=BUDGET_S)
    monkeypatch.setattr(first_use, "capturing", lambda: True)
    dispatch.get_kernel(PROBLEM, ROWS)
    assert dispatch.chosen(PROBLEM, ROWS).source == "default"
    assert tunes.evaluators == [] and not env.exists()
    # Once the capture is over, the next first call of the shape tunes it.
    monkeypatch.setattr(first_use, "capturing", lambda: False)
    dispatch.clear_cache()
    dispatch.get_kernel(PROBLEM, ROWS)
    assert len(tunes.evaluators) == 1 and dispatch.chosen(PROBLEM, ROWS).source == "user"


class _Stream:
    def __init__(self, ptr: int, answer: Any) -> None:
        self.ptr, self.answer = ptr, answer

    def is_capturing(self) -> bool:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def _fake_cupy(stream: _Stream) -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(cuda=SimpleNamespace(get_current_stream=lambda: stream))


def _fake_torch(initialized: bool, captures: bool) -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(cuda=SimpleNamespace(is_initialized=lambda: initialized,
                                                is_current_stream_capturing=lambda: captures))


@pytest.mark.parametrize(("cupy", "torch", "expected"), [
    (None, None, False),
    (_Stream(1234, False), None, False),
    (_Stream(1234, True), None, True),
    (_Stream(0, RuntimeError("legacy stream")), None, False),  # the legacy stream is not asked
    (_Stream(1234, RuntimeError("capture state unknown")), None, True),
    (None, (True, True), True),
    (None, (True, False), False),
    (None, (False, True), False),  # torch never used CUDA: nothing of its own can capture
    (_Stream(0, False), (True, True), True),
])
def test_capture_is_asked_of_the_current_stream(monkeypatch, cupy, torch, expected):
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    if cupy is not None:
        monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(cupy))
    if torch is not None:
        monkeypatch.setitem(sys.modules, "torch", _fake_torch(*torch))
    assert first_use.capturing() is expected


def test_a_read_only_database_is_not_tuned_into(env, tunes, monkeypatch, capsys):
    from autonorm.store import connection

    monkeypatch.setattr(connection, "read_only_reason", lambda path: "the file cannot be written")
    autonorm.tune_on_first_use(True, budget_s=BUDGET_S)
    dispatch.get_kernel(PROBLEM, ROWS)
    dispatch.get_kernel(OTHER, ROWS)
    assert dispatch.chosen(PROBLEM, ROWS).source == "default"
    assert dispatch.chosen(OTHER, ROWS).source == "default"
    assert tunes.evaluators == []
    (said,) = lines(capsys.readouterr().err)  # once, for both shapes
    assert "read-only" in said and str(env) in said


def test_a_failing_search_falls_back_to_the_choice(env, tunes, capsys):
    autonorm.tune_on_first_use(True, budget_s=BUDGET_S)
    tunes.error = RuntimeError("the evaluator could not start\nsecond line")
    kernel = dispatch.get_kernel(PROBLEM, ROWS)
    assert kernel[0] == "compiled" and dispatch.chosen(PROBLEM, ROWS).source == "default"
    *_, said = lines(capsys.readouterr().err)
    assert "failed (RuntimeError: the evaluator could not start second line)" in said
    assert "default configuration" in said
    # Tried once a process: the next first call does not search again.
    dispatch.clear_cache()
    dispatch.get_kernel(PROBLEM, ROWS)
    assert len(tunes.evaluators) == 1


def test_a_search_without_a_verified_candidate_stores_nothing(env, tunes, capsys):
    autonorm.tune_on_first_use(True, budget_s=BUDGET_S)
    tunes.options["fail"] = lambda config: "verification"
    dispatch.get_kernel(PROBLEM, ROWS)
    assert dispatch.chosen(PROBLEM, ROWS).source == "default"
    with TuningDB(env) as db:
        assert db.get_winner(KEY) is None
    assert "no candidate that passed verification" in lines(capsys.readouterr().err)[-1]
