"""CPU: ``autonorm tune --workers N`` on a machine with fewer GPUs than workers.

Workers beyond the visible GPUs share them round-robin, and the command says so in one line on
stderr. The GPU count comes from CuPy at the call (never at import). Two spawned workers given
one GPU run the fake evaluator on one shared study: both see the same CUDA_VISIBLE_DEVICES,
both measure, and no configuration is measured twice.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
from click.testing import CliRunner
from fake_evaluator import FakeEvaluator, fake_evaluator_factory, read_log
from optuna.trial import TrialState

from autonorm import cli, lookup
from autonorm.ops.layer_norm.problem import Problem
from autonorm.runtime.device import DeviceInfo, NoGPUError
from autonorm.runtime.limits import H200
from autonorm.store.db import TuningDB
from autonorm.tune import session, workers
from autonorm.tune import trials as book
from autonorm.tune.search import TuneSettings
from autonorm.tune.storage import open_storage

pytestmark = pytest.mark.usefixtures("quiet_optuna")

DEVICE = DeviceInfo(name="NVIDIA H200", cc=90, sm_count=132, l2_bytes=62914560,
                    smem_optin=232448, mem_bus_bits=6016, mem_clock_khz=3201000)
PROBLEM = Problem(4096, "bfloat16")
ROWS = 1024
# Bounds a wait for the other worker: it only turns a hang into a failure.
WAIT_S = 120.0


# --------------------------------------------------------------------------- the assignment


@pytest.mark.parametrize(("n_workers", "n_gpus", "expected"), [
    (1, 1, [0]), (2, 1, [0, 0]), (3, 1, [0, 0, 0]), (2, 2, [0, 1]), (3, 2, [0, 1, 0]),
    (4, 2, [0, 1, 0, 1]), (2, 8, [0, 1]),
])
def test_workers_take_a_gpu_each_then_share_round_robin(n_workers, n_gpus, expected):
    assert workers.assign_gpus(n_workers, n_gpus) == expected


@pytest.mark.parametrize(("n_workers", "n_gpus", "notice"), [
    (2, 1, "2 workers on 1 GPU: workers share GPU 0"),
    (3, 2, "3 workers on 2 GPUs: workers share GPU 0"),
    (4, 2, "4 workers on 2 GPUs: workers share GPUs 0, 1"),
    (1, 1, None), (2, 2, None), (2, 8, None),
])
def test_the_notice_names_the_shared_gpus_only_where_there_are(n_workers, n_gpus, notice):
    assert workers.sharing_notice(n_workers, n_gpus) == notice


def test_no_workers_or_no_gpu_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        workers.assign_gpus(0, 1)
    with pytest.raises(ValueError, match="no GPU"):
        workers.assign_gpus(2, 0)


def test_the_gpu_count_comes_from_cupy_at_the_call(monkeypatch):
    import autonorm.runtime.device

    runtime = SimpleNamespace(getDeviceCount=lambda: 3)
    fake_cupy = SimpleNamespace(cuda=SimpleNamespace(runtime=runtime))
    monkeypatch.setattr(autonorm.runtime.device, "import_cupy", lambda: fake_cupy)
    assert workers.visible_gpu_count() == 3

    def no_cupy():
        raise NoGPUError("CuPy is not installed")

    monkeypatch.setattr(autonorm.runtime.device, "import_cupy", no_cupy)
    with pytest.raises(NoGPUError):
        workers.visible_gpu_count()


def test_importing_the_workers_and_the_plan_needs_no_cupy(tmp_path):
    # A CuPy that fails loudly when imported stands first on the path, installed or not.
    (tmp_path / "cupy").mkdir()
    (tmp_path / "cupy" / "__init__.py").write_text("raise RuntimeError('cupy was imported')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])}
    code = "import autonorm.tune.workers, autonorm.tune.session, autonorm.cli_plan, autonorm.cli"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False, env=env)
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run([sys.executable, "-c", "import autonorm.tune.workers as w\n"
                           "w.visible_gpu_count()"], capture_output=True, text=True,
                          timeout=120, check=False, env=env)
    assert "cupy was imported" in proc.stderr  # the stand-in is what a call finds


# --------------------------------------------------------------------------- two workers, one GPU


class SharedGpuEvaluator(FakeEvaluator):
    """The fake evaluator, logging each call; its first measurement waits for the other worker's.

    So neither worker can finish the study alone, however the processes are scheduled.
    """

    def __init__(self, gate: str, n_workers: int, log_path: str) -> None:
        super().__init__(log_path=log_path, sleep_s=0.02)
        self.gate, self.n_workers, self.count = Path(gate), n_workers, 0

    def evaluate(self, config):  # noqa: ANN001, ANN201
        self.count += 1
        if self.count == 1:
            (self.gate / str(os.getpid())).touch()
            deadline = time.monotonic() + WAIT_S
            while len(os.listdir(self.gate)) < self.n_workers and time.monotonic() < deadline:
                time.sleep(0.05)
        return super().evaluate(config)


@dataclass(frozen=True)
class SharedGpuFactory:
    """Builds a :class:`SharedGpuEvaluator` in each process (picklable: workers are spawned)."""

    gate: str
    n_workers: int
    log_path: str

    def __call__(self, problem: Problem, rows: int) -> SharedGpuEvaluator:  # noqa: ARG002
        return SharedGpuEvaluator(self.gate, self.n_workers, self.log_path)


@pytest.fixture
def user_db(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("AUTONORM_DB", str(tmp_path / "user.db"))
    monkeypatch.setenv("AUTONORM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return tmp_path / "user.db"


def test_two_workers_on_one_gpu_split_one_study(tmp_path, user_db):
    gate, log = tmp_path / "gate", tmp_path / "calls.jsonl"
    gate.mkdir()
    journal = str(tmp_path / "shared.journal")
    tuned = session.tune_and_store(
        PROBLEM, ROWS, settings=TuneSettings(n_trials=12, batch=2, timeout_s=WAIT_S),
        device=DEVICE, storage=journal, workers=2, gpus=workers.assign_gpus(2, 1),
        evaluator_factory=SharedGpuFactory(str(gate), 2, str(log)), quiet=True,
    )
    assert tuned.stored and tuned.evaluated >= 12
    calls = [r for r in read_log(log) if r["event"] == "evaluate"]
    # Both workers ran, on the one GPU: each child saw CUDA_VISIBLE_DEVICES=0.
    assert len({r["pid"] for r in calls}) == 2 and {r["gpu"] for r in calls} == {"0"}
    configs = [tuple(sorted(r["config"].items())) for r in calls]
    assert len(configs) == len(set(configs))  # nothing measured twice
    study = optuna.load_study(study_name=tuned.study, storage=open_storage(journal, "x"))
    measured = [t for t in study.trials if book.is_measured(t)]
    assert len(measured) == len(calls) and not study.get_trials(states=[TrialState.RUNNING])
    assert len({t.user_attrs[book.ATTR_OWNER]["pid"] for t in measured}) == 2
    with TuningDB(user_db) as db:
        assert db.get_winner(tuned.key).config == tuned.config.to_dict()


def _recording_run_workers(calls: list):
    """A stand-in for run_workers that records how it was called; every worker 'exits' 0."""

    def run_workers(n_workers, target, args, *, storage_url, gpus=None):  # noqa: ANN001, ANN202, ARG001
        calls.append((n_workers, None if gpus is None else list(gpus)))
        return [0] * n_workers

    return run_workers


def test_the_session_fits_the_workers_to_the_gpus_it_sees(tmp_path, user_db, monkeypatch):
    calls: list = []
    monkeypatch.setattr(session, "run_workers", _recording_run_workers(calls))
    monkeypatch.setattr(session, "visible_gpu_count", lambda: 1)
    monkeypatch.setattr(session, "_build_evaluator", lambda *args: FakeEvaluator())
    settings = TuneSettings(n_trials=4, batch=2)
    journal = str(tmp_path / "s.journal")
    tuned = session.tune_and_store(PROBLEM, ROWS, settings=settings, device=DEVICE,
                                   storage=journal, workers=2, quiet=True)
    assert tuned.stored and calls == [(2, [0, 0])]
    # Given GPUs are used as given; with an evaluator factory (a fake one needs no GPU) and
    # none given, run_workers' own default (GPUs 0..n-1) stands. Neither counts the GPUs.
    def no_count() -> int:
        pytest.fail("the GPUs were counted")

    monkeypatch.setattr(session, "visible_gpu_count", no_count)
    calls.clear()
    session.tune_and_store(PROBLEM, ROWS, settings=settings, device=DEVICE, storage=journal,
                           workers=3, gpus=[0, 1, 0], quiet=True)
    session.tune_and_store(PROBLEM, ROWS, settings=settings, device=DEVICE, storage=journal,
                           workers=2, evaluator_factory=fake_evaluator_factory, quiet=True)
    assert calls == [(3, [0, 1, 0]), (2, None)]


# --------------------------------------------------------------------------- the command line


@pytest.fixture
def cli_env(tmp_path, monkeypatch):
    """A fake H200, a tmp user DB, the fake evaluator here and recorded (not spawned) workers."""
    import autonorm.runtime.device

    monkeypatch.setenv("AUTONORM_DB", str(tmp_path / "user.db"))
    monkeypatch.setenv("AUTONORM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("AUTONORM_NO_SHIPPED_DB", "1")
    monkeypatch.delenv("AUTONORM_SHIPPED_DB", raising=False)
    monkeypatch.setattr(autonorm.runtime.device, "query_device", lambda device_id=None: DEVICE)
    monkeypatch.setattr(session, "_build_evaluator", lambda *args: FakeEvaluator())
    calls: list = []
    monkeypatch.setattr(session, "run_workers", _recording_run_workers(calls))
    counted: list[int] = []

    def gpus_seen(n: int) -> None:
        def count() -> int:
            counted.append(n)
            return n

        monkeypatch.setattr(workers, "visible_gpu_count", count)

    return SimpleNamespace(calls=calls, counted=counted, gpus_seen=gpus_seen, tmp=tmp_path)


def _tune(args: list[str]):
    result = CliRunner().invoke(cli.main, ["tune", "--trials", "4", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    return result


def _sharing_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if " workers on " in line]


def test_tune_with_more_workers_than_gpus_shares_them_and_says_so(cli_env):
    cli_env.gpus_seen(1)
    result = _tune(["--hidden", "4096", "--rows", "1000", "--workers", "2",
                    "--storage", str(cli_env.tmp / "w.journal")])
    assert result.exit_code == 0, result.output
    assert _sharing_lines(result.stderr) == ["2 workers on 1 GPU: workers share GPU 0"]
    assert cli_env.calls == [(2, [0, 0])]
    assert "winner: " in result.stdout


def test_a_plan_says_it_once_and_gives_every_shape_the_same_gpus(cli_env):
    cli_env.gpus_seen(2)
    result = _tune(["--hidden", "1024,2048", "--rows", "64", "--workers", "3",
                    "--storage", str(cli_env.tmp / "w.journal")])
    assert result.exit_code == 0, result.output
    assert _sharing_lines(result.stderr) == ["3 workers on 2 GPUs: workers share GPU 0"]
    assert cli_env.calls == [(3, [0, 1, 0]), (3, [0, 1, 0])]


def test_enough_gpus_means_one_each_and_no_notice(cli_env):
    cli_env.gpus_seen(2)
    result = _tune(["--hidden", "4096", "--rows", "1000", "--workers", "2",
                    "--storage", str(cli_env.tmp / "w.journal")])
    assert result.exit_code == 0, result.output
    assert _sharing_lines(result.stderr) == []
    assert cli_env.calls == [(2, [0, 1])]


def test_one_worker_counts_no_gpus_and_starts_no_workers(cli_env):
    cli_env.gpus_seen(1)
    result = _tune(["--hidden", "4096", "--rows", "1000"])
    assert result.exit_code == 0, result.output
    assert cli_env.counted == [] and cli_env.calls == []
    assert _sharing_lines(result.stderr) == []


def test_gpus_that_cannot_be_counted_end_in_one_error_line(cli_env, monkeypatch):
    def no_count() -> int:
        raise NoGPUError("no CUDA GPU is usable here: cudaErrorNoDevice")

    monkeypatch.setattr(workers, "visible_gpu_count", no_count)
    result = _tune(["--hidden", "4096", "--workers", "2"])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 1 and lines[-1] == (
        "error: autonorm tune --workers needs CUDA GPUs: no CUDA GPU is usable here: "
        "cudaErrorNoDevice"), result.stderr
    assert cli_env.calls == []


def test_sqlite_shared_by_workers_ends_in_one_error_line(cli_env):
    cli_env.gpus_seen(2)
    study_db = cli_env.tmp / "study.db"
    result = _tune(["--hidden", "4096", "--workers", "2", "--storage", f"sqlite:///{study_db}"])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith("error: Invalid value for --storage: SQLite storage"), lines
    assert "cannot be shared by 2 workers" in lines[0] and "journal" in lines[0]
    assert cli_env.calls == [] and not study_db.exists()


# --------------------------------------------------------------------------- the seeds


@dataclass(frozen=True)
class LateFactory:
    """Builds the fake evaluator; late (``delay_s``) in the worker given GPU ``late_gpu``."""

    late_gpu: str
    delay_s: float

    def __call__(self, problem: Problem, rows: int) -> FakeEvaluator:  # noqa: ARG002
        if os.environ.get("CUDA_VISIBLE_DEVICES") == self.late_gpu:
            time.sleep(self.delay_s)
        return FakeEvaluator(sleep_s=0.02)


def test_the_seeds_come_first_whichever_worker_starts_first(tmp_path, user_db):
    from autonorm.ops.layer_norm.family import FAMILY

    journal = str(tmp_path / "shared.journal")
    with TuningDB(user_db) as db, lookup.dispatch_stores(db) as stores:
        # What dispatch runs now (on this H200, the shipped winner of a nearby bucket) is
        # measured first, then the family's seeds.
        running = session.running_pick(stores, PROBLEM, ROWS, DEVICE, H200).config
    tuned = session.tune_and_store(
        PROBLEM, ROWS, settings=TuneSettings(n_trials=8, batch=4, timeout_s=WAIT_S),
        device=DEVICE, storage=journal, workers=2, gpus=[0, 1],
        evaluator_factory=LateFactory("0", 3.0), quiet=True,
    )
    assert tuned.stored
    study = optuna.load_study(study_name=tuned.study, storage=open_storage(journal, "x"))
    seeds = list(dict.fromkeys([running, *FAMILY.seeds(PROBLEM, H200, ROWS)]))
    # The study's first trials are the seeds (those still waiting were never asked: the study
    # had its 8 candidates), asked by the worker that started first.
    asked = [t for t in study.trials[: len(seeds)] if t.state != TrialState.WAITING]
    assert len(asked) >= 8
    assert all(FAMILY.config_from_dict(t.params) == seeds[t.number] for t in asked)
