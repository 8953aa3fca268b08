"""One study shared by several tuner processes through a real server: PostgreSQL and Redis.

Each tuner is a spawned process that searches the study with the fake evaluator, as one machine
of a fleet running ``autonorm tune --storage <url>`` would; the winner is then stored by one
last call that runs the finals. The servers come from the environment (``.ci/run`` starts
both): AUTONORM_TEST_POSTGRES_URL and AUTONORM_TEST_REDIS_URL. Where one is not set its tests
skip and say why (under CI they fail); a URL that is set but cannot be reached fails them.

Nothing here bounds how fast anything runs: every wait polls for a state, with generous limits.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import re
import secrets
import signal
import socket
import time
from pathlib import Path

import optuna
import pytest
from fake_evaluator import FakeEvaluator, fake_evaluator_factory, fake_median_us, read_log
from optuna.trial import TrialState

from autonorm.ops.layer_norm.family import FAMILY
from autonorm.ops.layer_norm.problem import Problem
from autonorm.runtime.device import DeviceInfo
from autonorm.runtime.limits import H200
from autonorm.store.db import TuningDB, TuningKey
from autonorm.tune import search
from autonorm.tune import trials as book
from autonorm.tune.session import study_for, tune_and_store
from autonorm.tune.storage import HeartbeatStorage, open_storage

pytestmark = [
    pytest.mark.usefixtures("quiet_optuna"),
    pytest.mark.filterwarnings("ignore:JournalRedisBackend is experimental"),
]

# The memory clock is in the GPU's fingerprint and so in the study's name, not in its limits:
# one made up for this pytest process keeps its studies apart from those of another pytest
# process on the same server. Spawned tuners inherit it through the environment.
_RUN_CLOCK = "AUTONORM_TEST_RUN_CLOCK_KHZ"
os.environ.setdefault(_RUN_CLOCK, str(4_000_000 + secrets.randbelow(1_000_000)))
DEVICE = DeviceInfo(
    name=H200.name, cc=H200.cc, sm_count=H200.sm_count, l2_bytes=H200.l2_bytes,
    smem_optin=H200.max_smem_optin, mem_bus_bits=6144, mem_clock_khz=int(os.environ[_RUN_CLOCK]),
)
PROBLEM = Problem(4096, "bfloat16")
ROWS = 1024
KEY = TuningKey.for_problem(DEVICE.fingerprint, PROBLEM, ROWS)
STUDY = study_for(PROBLEM, ROWS, DEVICE)
# Short beats so a dead tuner's trial is reclaimed within seconds; the grace is still many
# beats long, so a live tuner on a loaded machine is never taken for dead.
BEAT_S = 1
GRACE_S = 8
# Generous bounds on every wait: they only turn a hang into a failure.
WAIT_S = 150.0
POLL_S = 0.1
# A tuner that stands for a process on another machine: its pid cannot be inspected from here.
OTHER_HOST = "fleet-peer.invalid"

SERVERS = {"postgresql": "AUTONORM_TEST_POSTGRES_URL", "redis": "AUTONORM_TEST_REDIS_URL"}


def _unreachable(kind: str, url: str) -> str | None:
    """Return why the server at ``url`` cannot be used, or None when it answers."""
    try:
        if kind == "postgresql":
            import sqlalchemy

            engine = sqlalchemy.create_engine(url, connect_args={"connect_timeout": 5})
            try:
                with engine.connect() as connection:
                    connection.execute(sqlalchemy.text("SELECT 1"))
            finally:
                engine.dispose()
        else:
            import redis

            redis.Redis.from_url(url, socket_connect_timeout=5).ping()
    except ImportError as exc:
        return f"the {kind} client is not installed ({exc}): pip install -e '.[dev]'"
    except Exception as exc:  # noqa: BLE001 - any failure to connect means: skip, saying why
        where = re.sub(r"://[^@/]*@", "://***@", url)  # no password in the test report
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"the {kind} server at {where} cannot be reached: {type(exc).__name__}: {first}"
    return None


def _delete_study(url: str) -> None:
    with contextlib.suppress(KeyError):  # no study of that name
        optuna.delete_study(study_name=STUDY, storage=storage_at(url))


@pytest.fixture(params=sorted(SERVERS))
def server(request):
    """(kind, URL) of a reachable server with no study of the tests' name in it (nor after)."""
    kind = request.param
    url = os.environ.get(SERVERS[kind])
    if not url:
        if os.environ.get("CI"):
            pytest.fail(f"CI set no {SERVERS[kind]}: .ci/run must start the {kind} server")
        pytest.skip(f"no {kind} server: set {SERVERS[kind]} (.ci/run starts one)")
    reason = _unreachable(kind, url)
    if reason is not None:
        # A server was named: its tests must not vanish behind a skip.
        pytest.fail(reason)
    _delete_study(url)
    yield kind, url
    _delete_study(url)


class GatedEvaluator(FakeEvaluator):
    """The fake evaluator, made to take part: its first measurement waits for every tuner's.

    So no tuner can finish the study before each has measured a candidate, however the
    processes are scheduled. From call ``hang_from`` on it never returns (it is killed then);
    with ``wait_for_hang`` the other tuners' later measurements wait until it hangs, so the
    study is still under way when it is killed.
    """

    def __init__(self, gate_dir: str, n_tuners: int, hang_from: int | None,
                 wait_for_hang: bool, **kwargs) -> None:
        super().__init__(**kwargs)
        self.gate_dir = gate_dir
        self.n_tuners = n_tuners
        self.hang_from = hang_from
        self.wait_for_hang = wait_for_hang
        self.count = 0

    def wait_until(self, done) -> None:
        deadline = time.monotonic() + WAIT_S
        while not done() and time.monotonic() < deadline:
            time.sleep(POLL_S)

    def evaluate(self, config):
        self.count += 1
        hung = Path(self.gate_dir).parent / "hung"
        if self.count == 1:
            Path(self.gate_dir, str(os.getpid())).touch()
            self.wait_until(lambda: len(os.listdir(self.gate_dir)) >= self.n_tuners)
        elif self.hang_from is not None and self.count >= self.hang_from:
            hung.touch()
            time.sleep(10 * WAIT_S)
        elif self.wait_for_hang:
            self.wait_until(hung.exists)
        return super().evaluate(config)


def tuner(index: int, url: str, tmp: str, n_trials: int, n_tuners: int, sleep_s: float,
          hang_from: int | None, wait_for_hang: bool, host: str | None) -> None:
    """Search the shared study, recording outcomes in the tuning DB; ``host``: pose as another."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if host is not None:
        socket.gethostname = lambda: host  # the owner check of autonorm.tune.trials reads it
    storage = open_storage(url, STUDY, heartbeat_s=BEAT_S, grace_s=GRACE_S)
    db = TuningDB(Path(tmp, "user.db"))
    evaluator = GatedEvaluator(
        str(Path(tmp, "gate")), n_tuners, hang_from, wait_for_hang, sleep_s=sleep_s,
        log_path=Path(tmp, "calls.jsonl"),
    )

    def record(config, outcome, number) -> None:
        db.record_outcome(KEY, config, outcome, trial_number=number)

    try:
        search.tune(
            PROBLEM, evaluator, limits=H200, storage=storage, study_name=STUDY,
            on_trial=record, progress=False, worker_index=index,
            settings=search.TuneSettings(n_trials, timeout_s=WAIT_S, batch=2, finals_top=0),
        )
    finally:
        db.close()


@pytest.fixture
def processes():
    """The tuner processes a test starts; any still alive at its end is killed."""
    started: list = []
    yield started
    for process in started:
        if process.is_alive():
            process.kill()
        process.join(timeout=WAIT_S)


def start_tuners(processes: list, tmp_path: Path, url: str, n_trials: int, sleep_s: float,
                 hang_from: list[int | None], hosts: list[str | None]) -> list:
    """Start one spawned tuner per entry of ``hang_from`` (and of ``hosts``)."""
    (tmp_path / "gate").mkdir()
    context = multiprocessing.get_context("spawn")
    victim = any(hang is not None for hang in hang_from)
    for index, (hang, host) in enumerate(zip(hang_from, hosts, strict=True)):
        process = context.Process(
            target=tuner, daemon=True,
            args=(index, url, str(tmp_path), n_trials, len(hosts), sleep_s, hang, victim, host),
        )
        process.start()
        processes.append(process)
    return processes


def join_all(processes: list[multiprocessing.Process]) -> list[int | None]:
    """Wait for the tuners (bounded: the fixture kills any left) and return their exit codes."""
    deadline = time.monotonic() + WAIT_S
    for process in processes:
        process.join(timeout=max(0.0, deadline - time.monotonic()))
    return [process.exitcode for process in processes]


def wait_for(predicate, what: str):
    """Poll ``predicate`` until it returns something truthy; fail after :data:`WAIT_S`."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(POLL_S)
    pytest.fail(f"gave up waiting for {what}")


@functools.cache
def storage_at(url: str):
    """One storage per server for the test process (each opens a pool of connections)."""
    return open_storage(url, STUDY, heartbeat_s=BEAT_S, grace_s=GRACE_S)


def trials_of(url: str) -> list[optuna.trial.FrozenTrial]:
    """Read the study's trials; a PostgreSQL storage reclaims trials whose beat stopped first."""
    storage = storage_at(url)
    study = optuna.load_study(study_name=STUDY, storage=storage)
    trials = study.get_trials()
    # What every tuner's loop does: fail RUNNING trials of dead processes on this host.
    book.fail_stale_trials(storage, storage.get_study_id_from_name(STUDY), trials)
    return study.get_trials()


def measured(trials) -> list[optuna.trial.FrozenTrial]:
    return [t for t in trials if book.is_measured(t)]


def finish_and_store(tmp_path: Path, url: str, n_trials: int):
    """The last call: what ``autonorm tune`` does after its workers (finals, then store)."""
    return tune_and_store(
        PROBLEM, ROWS, device=DEVICE, storage=url, store=tmp_path / "user.db",
        settings=search.TuneSettings(n_trials=n_trials, finals_top=3, finals_rounds=2),
        evaluator_factory=fake_evaluator_factory, quiet=True,
    )


def check_budget(done, n_trials: int, n_tuners: int) -> None:
    """The requested number of distinct configurations was measured, none twice.

    Tuners check the budget before each measurement, so the last ones in flight at once may
    each add one (see :func:`autonorm.tune.search.tune`).
    """
    assert n_trials <= len(done) <= n_trials + n_tuners - 1
    assert len({book.params_key(t.params) for t in done}) == len(done)


def check_one_winner(tmp_path: Path, tuned, trials) -> None:
    """The study's best measured configuration is stored once, with every outcome recorded."""
    done = measured(trials)
    best = min((FAMILY.config_from_dict(t.params) for t in done), key=fake_median_us)
    assert tuned.stored and tuned.config == best
    with TuningDB(tmp_path / "user.db") as db:
        assert [w.key for w in db.winners()] == [KEY]
        assert db.get_winner(KEY).config == best.to_dict()
        ok = [t for t in db.trials(KEY) if t["status"] == "ok"]
        # Each measurement recorded once (a killed tuner may die before recording its last).
        assert len(ok) <= len(done)
        assert len({FAMILY.config_from_dict(t["config"]) for t in ok}) == len(ok)


def test_tuners_split_the_trials_and_the_winner_is_stored_once(tmp_path, server, processes):
    kind, url = server
    n_trials = 12
    start_tuners(processes, tmp_path, url, n_trials, 0.05, [None] * 3, [None] * 3)
    codes = join_all(processes)
    assert codes == [0, 0, 0]

    trials = trials_of(url)
    done = measured(trials)
    check_budget(done, n_trials, len(processes))
    # Every tuner measured some of them.
    by_pid = {t.user_attrs[book.ATTR_OWNER]["pid"] for t in done}
    assert by_pid == {p.pid for p in processes}, kind
    evaluations = [r for r in read_log(tmp_path / "calls.jsonl") if r["event"] == "evaluate"]
    assert len(evaluations) == len(done)

    tuned = finish_and_store(tmp_path, url, n_trials)
    after = trials_of(url)
    assert tuned.evaluated == len(done)
    assert len(measured(after)) == len(done)  # the last call measured nothing new
    check_one_winner(tmp_path, tuned, after)


def test_a_killed_tuner_loses_no_finished_trial_and_its_trial_is_reclaimed(
    tmp_path, server, processes
):
    kind, url = server
    n_trials = 14
    # The victim hangs in its second measurement, so it is killed mid-evaluation. On PostgreSQL
    # it stands for another machine: only the heartbeat can tell it died. Redis journals have
    # no heartbeat; there the owner check reclaims the trial of a process that died on this host.
    victim_host = OTHER_HOST if kind == "postgresql" else None
    start_tuners(
        processes, tmp_path, url, n_trials, 0.05, [None, None, 2], [None, None, victim_host]
    )
    victim = processes[2]

    def victim_state():
        if not victim.is_alive():
            pytest.fail(f"the victim tuner exited early with code {victim.exitcode}")
        try:
            trials = trials_of(url)
        except KeyError:  # the study is not created yet
            return None
        mine = [t for t in trials if t.user_attrs.get(book.ATTR_OWNER, {}).get("pid") == victim.pid]
        complete = measured(mine)
        running = [
            t for t in mine
            if t.state == TrialState.RUNNING
            and t.user_attrs.get(book.ATTR_ROLE) == book.ROLE_EVALUATE
        ]
        hung = (tmp_path / "hung").exists()
        return (trials, running[0]) if hung and complete and running else None

    before, in_flight = wait_for(victim_state, "the victim to finish a trial and start another")
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(timeout=WAIT_S)
    assert victim.exitcode == -signal.SIGKILL

    # No finished trial is lost: each is still there, finished as it was.
    after_kill = {t.number: t for t in trials_of(url)}
    complete = [t for t in after_kill.values() if t.state == TrialState.COMPLETE]
    assert len(complete) >= sum(t.state == TrialState.COMPLETE for t in before)
    for trial in before:
        if trial.state.is_finished():
            assert after_kill[trial.number].state == trial.state
            assert after_kill[trial.number].value == trial.value
    victims = {t.number for t in measured(before)
               if t.user_attrs[book.ATTR_OWNER]["pid"] == victim.pid}
    assert victims  # it measured one before it hung

    # Its RUNNING trials are reclaimed: failed as interrupted, so their configurations may be
    # measured again and they do not count. Every one of them, not only the one it hung in: a
    # batch's next trial beats a moment later, so it may go stale a reclaim after the first.
    def reclaimed():
        trials = trials_of(url)
        if any(t.state == TrialState.RUNNING
               and t.user_attrs.get(book.ATTR_OWNER, {}).get("pid") == victim.pid
               for t in trials):
            return None
        return next(t for t in trials if t.number == in_flight.number)

    lost = wait_for(reclaimed, "every running trial of the killed tuner to be reclaimed")
    assert lost.state == TrialState.FAIL
    assert lost.user_attrs[book.ATTR_FAILURE] == book.INTERRUPTED
    assert "stale" in lost.user_attrs[book.ATTR_ERROR]
    if kind == "postgresql":
        assert "heartbeat" in lost.user_attrs[book.ATTR_ERROR]

    # The survivors finish the study: the requested number of distinct measurements.
    assert join_all(processes[:2]) == [0, 0]
    tuned = finish_and_store(tmp_path, url, n_trials)
    trials = trials_of(url)
    done = measured(trials)
    check_budget(done, n_trials, len(processes))
    assert victims <= {t.number for t in done}  # the killed tuner's measurements count
    assert tuned.evaluated == len(done)
    # Named by owner and role where one is left, so a failure says which process left it.
    left = [(t.number, t.user_attrs.get(book.ATTR_OWNER), t.user_attrs.get(book.ATTR_ROLE),
             t.datetime_start) for t in trials if t.state == TrialState.RUNNING]
    assert not left, f"RUNNING trials left (victim pid {victim.pid}): {left}"
    check_one_winner(tmp_path, tuned, trials)


@pytest.mark.parametrize("server", ["postgresql"], indirect=True)  # Redis journals do not beat
def test_postgresql_trials_beat_from_when_they_run(server):
    _, url = server
    import sqlalchemy

    storage = open_storage(url, STUDY, heartbeat_s=BEAT_S, grace_s=GRACE_S)
    assert isinstance(storage, HeartbeatStorage)
    study = optuna.create_study(storage=storage, study_name=STUDY)
    study.enqueue_trial({"x": 1.0})

    def beating() -> set[int]:
        with storage.engine.connect() as connection:
            rows = connection.execute(sqlalchemy.text("SELECT trial_id FROM trial_heartbeats"))
            return {row[0] for row in rows}

    waiting = {t._trial_id for t in study.get_trials()}
    assert not waiting & beating()  # a queued trial does not beat before it runs
    queued = study.ask()  # taken from the queue
    fresh = study.ask()
    assert {queued._trial_id, fresh._trial_id} <= beating()
    study.tell(queued, 1.0)
    study.tell(fresh, 2.0)
    assert storage.reclaim_stale_trials(study._study_id) == []
    storage.engine.dispose()
    with pytest.raises(ValueError, match="heartbeat_s"):
        open_storage(url, STUDY, heartbeat_s=5, grace_s=5)
