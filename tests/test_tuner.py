"""Tests of the Optuna search (autonorm.tune.search, storage, workers) with a fake evaluator.

CPU only.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import optuna
import pytest
from fake_evaluator import (
    WORKER_PROBLEM,
    WORKER_STUDY,
    FakeEvaluator,
    fake_median_us,
    read_log,
    tune_worker,
)
from optuna.storages import JournalStorage, RDBStorage
from optuna.trial import TrialState

from autonorm.ops import layer_norm as space
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.family import FAMILY
from autonorm.ops.layer_norm.problem import Problem
from autonorm.results import Outcome, Timing
from autonorm.runtime.limits import H200
from autonorm.tune.search import TuneSettings, tune
from autonorm.tune.storage import open_storage, study_name_for
from autonorm.tune.trials import has_all_params
from autonorm.tune.workers import run_workers

BF16 = Problem(hidden=4096, dtype="bfloat16")
QUIET = {"progress": False, "limits": H200}


pytestmark = pytest.mark.usefixtures("quiet_optuna")


def load(path: Path, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=open_storage(str(path), name))


def configs_of(trials) -> list[KernelConfig]:
    return [KernelConfig.from_dict(t.params) for t in trials]


def dead_pid() -> int:
    """Return the pid of a process that has exited and been reaped."""
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stdout)


def leave_running_trial(path: Path, name: str, config: KernelConfig, pid: int) -> int:
    """Leave a RUNNING trial owned by ``pid`` on this host, as a killed worker would."""
    study = optuna.create_study(
        storage=open_storage(str(path), name), study_name=name, direction="minimize"
    )
    study.enqueue_trial(config.to_dict())
    trial = study.ask()
    trial.set_user_attr("owner", {"host": socket.gethostname(), "pid": pid, "start": None})
    assert FAMILY.suggest(trial) == config  # the enqueued parameters
    return trial.number


# --------------------------------------------------------------------------- names and storage


@dataclass(frozen=True)
class OtherOp:
    """A problem of another op with LayerNorm's dtype and hidden size (for names only)."""

    hidden: int
    dtype: str
    op: ClassVar[str] = "scaled_copy"

    def fields(self) -> dict:
        return {"hidden": self.hidden, "dtype": self.dtype}


def test_study_name_is_readable_safe_and_distinct():
    fp = "NVIDIA H200|sm90|132sm|l2=62914560|bus=6144|memclk=3201000"
    name = study_name_for(fp, "0.1.0", BF16, 1024)
    assert name.startswith("nvidia-h200-")
    assert "bfloat16" in name and "h4096" in name and "r1024" in name
    # The op and every other field of the problem, by name.
    assert "layer-norm" in name and "has-weight1" in name and "has-bias1" in name
    assert all(c.isalnum() or c in "._-" for c in name)
    others = {
        study_name_for(fp, "0.1.1", BF16, 1024),
        study_name_for(fp.replace("memclk=3201000", "memclk=2619000"), "0.1.0", BF16, 1024),
        study_name_for(fp, "0.1.0", Problem(4096, "float16"), 1024),
        study_name_for(fp, "0.1.0", Problem(4096, "bfloat16", has_bias=False), 1024),
        study_name_for(fp, "0.1.0", BF16, 2048),
        study_name_for(fp, "0.1.0", OtherOp(4096, "bfloat16"), 1024),
    }
    assert name not in others and len(others) == 6
    with pytest.raises(ValueError):
        study_name_for(fp, "0.1.0", BF16, 0)


def test_a_trial_is_ready_once_its_family_asks_nothing_more():
    # The family's suggest() is replayed on the parameters written so far: a bulk-copy trial
    # needs stages, and no stats or blocks_per_sm; the others the reverse.
    bulk = KernelConfig(256, 8, 2, "bulk", "two_pass", 1, 0, 2)
    study = optuna.create_study()
    for config in (bulk, INCUMBENT):
        study.enqueue_trial(config.to_dict())
        trial = study.ask()
        assert FAMILY.suggest(trial) == config
        frozen = study.trials[trial.number]
        assert has_all_params(frozen, FAMILY)
        for name in frozen.params:
            partial = optuna.trial.create_trial(
                state=TrialState.RUNNING,
                params={k: v for k, v in frozen.params.items() if k != name},
                distributions={k: v for k, v in frozen.distributions.items() if k != name},
            )
            assert not has_all_params(partial, FAMILY), name


def test_open_storage_default_is_a_journal_file_under_the_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTONORM_CACHE_DIR", str(tmp_path / "cache"))
    storage = open_storage(None, "my-study")
    assert isinstance(storage, JournalStorage)
    optuna.create_study(storage=storage, study_name="my-study")
    journal = tmp_path / "cache" / "studies" / "my-study.journal"
    assert journal.stat().st_size > 0
    # tune() without a storage uses the same file.
    tune(BF16, FakeEvaluator(), study_name="my-study", settings=TuneSettings(n_trials=2), **QUIET)
    assert len(load(journal, "my-study").get_trials(states=[TrialState.COMPLETE])) >= 2


def test_open_storage_explicit_paths(tmp_path):
    plain = tmp_path / "a" / "b" / "s.journal"
    optuna.create_study(storage=open_storage(str(plain), "s"), study_name="s")
    assert plain.stat().st_size > 0
    url_file = tmp_path / "u.journal"
    optuna.create_study(storage=open_storage(f"journal://{url_file}", "s"), study_name="s")
    assert url_file.stat().st_size > 0
    folder = tmp_path / "studies"
    folder.mkdir()
    optuna.create_study(storage=open_storage(str(folder), "s2"), study_name="s2")
    assert (folder / "s2.journal").stat().st_size > 0


def test_sqlite_is_for_one_worker_only(tmp_path):
    url = f"sqlite:///{tmp_path / 'one.db'}"
    assert isinstance(open_storage(url, "s"), RDBStorage)
    with pytest.raises(ValueError, match="journal"):
        run_workers(2, tune_worker, (), storage_url=url, gpus=[0, 1])


def test_unsupported_and_missing_backends_are_explained():
    with pytest.raises(ValueError, match="unsupported storage URL"):
        open_storage("ftp://example/x", "s")
    try:
        import redis  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install redis"):
            open_storage("redis://localhost:6379/0", "s")


# --------------------------------------------------------------------------- the search


def test_n_trials_is_honoured_and_finals_pick_the_fastest(tmp_path):
    evaluator = FakeEvaluator()
    settings = TuneSettings(n_trials=12, batch=4, finals_top=3, finals_rounds=7)
    result = tune(
        BF16,
        evaluator,
        storage=str(tmp_path / "s.journal"),
        study_name="s",
        settings=settings,
        **QUIET,
    )
    assert len(evaluator.calls) == 12 == len(set(evaluator.calls)) == result.evaluated
    assert all(len(batch) <= 4 for batch in evaluator.prepared)
    assert [c for batch in evaluator.prepared for c in batch] == evaluator.calls
    ((contenders, rounds),) = evaluator.retimed
    assert rounds == 7 and len(contenders) == 3 == len(set(contenders))
    assert result.best == min(evaluator.calls, key=fake_median_us)
    assert result.timing.median_us == fake_median_us(result.best)
    assert result.kept is None and result.study_name == "s"


def test_invalid_configs_are_pruned_and_never_evaluated(tmp_path):
    problem = Problem(hidden=1000, dtype="float16")  # vec 8 and most wide shapes are invalid
    seen: list[tuple[KernelConfig, Outcome, int]] = []
    evaluator = FakeEvaluator()
    result = tune(
        problem,
        evaluator,
        storage=str(tmp_path / "s.journal"),
        study_name="s",
        settings=TuneSettings(n_trials=10, finals_top=0),
        on_trial=lambda c, o, n: seen.append((c, o, n)),
        **QUIET,
    )
    assert len(evaluator.calls) == 10
    for batch in evaluator.prepared:
        assert all(not space.check(c, problem, H200) for c in batch)
    study = load(tmp_path / "s.journal", "s")
    invalid = [t for t in study.trials if t.user_attrs.get("failure") == "invalid"]
    assert invalid and all(t.state == TrialState.PRUNED for t in invalid)
    assert not set(configs_of(invalid)) & set(evaluator.calls)
    reported = {n: (c, o) for c, o, n in seen if o.status == "invalid"}
    assert set(reported) == {t.number for t in invalid}
    for config, outcome in reported.values():
        assert outcome.error == "; ".join(space.check(config, problem, H200))
    assert result.failures["invalid"] == len(set(configs_of(invalid)))
    assert sum(o.ok for _, o, _ in seen) == 10


def test_without_finals_the_result_is_the_fastest_measured(tmp_path):
    evaluator = FakeEvaluator()
    result = tune(
        BF16, evaluator, storage=str(tmp_path / "s.journal"), study_name="s",
        settings=TuneSettings(n_trials=10, batch=4, finals_top=0), **QUIET,
    )
    assert evaluator.retimed == []  # no finals
    fastest = min(evaluator.calls, key=fake_median_us)
    assert fake_median_us(fastest) < max(map(fake_median_us, evaluator.calls))  # a real choice
    assert result.best == fastest and result.kept is None
    assert result.timing.median_us == fake_median_us(fastest)


# The fake timer's fastest kernels (the register cache): here they all fail verification.
FAST_BUT_WRONG = (
    KernelConfig(256, 8, 1, "registers", "two_pass", 1, 0),
    KernelConfig(256, 8, 1, "registers", "welford", 1, 0),
)


@pytest.mark.parametrize("finals_top", [0, 3])
def test_a_candidate_that_fails_verification_never_wins(tmp_path, finals_top):
    evaluator = FakeEvaluator(fail=lambda c: "verification" if c.cache == "registers" else None)
    seeds = [*FAST_BUT_WRONG, KernelConfig(256, 8, 1, "smem", "two_pass", 1, 0)]
    result = tune(
        BF16, evaluator, storage=str(tmp_path / "s.journal"), study_name="s", seeds=seeds,
        settings=TuneSettings(n_trials=10, batch=4, finals_top=finals_top), **QUIET,
    )
    assert set(FAST_BUT_WRONG) <= set(evaluator.calls)
    assert result.failures["verification"] >= len(FAST_BUT_WRONG)
    assert result.best is not None and result.best.cache != "registers"
    assert fake_median_us(result.best) > max(map(fake_median_us, FAST_BUT_WRONG))
    passed = [c for c in evaluator.calls if c.cache != "registers"]
    assert result.best == min(passed, key=fake_median_us)
    for contenders, _ in evaluator.retimed:
        assert not any(c.cache == "registers" for c in contenders)


def classify(config: KernelConfig) -> str | None:
    if config.blocks_per_sm == 8:
        return "compile"
    if config.rows_per_block == 2:
        return "launch"
    if config.stats == "two_pass" and config.cache == "smem":
        return "verification"
    return None


# One valid configuration of each failure class of classify(), measured first: which classes
# TPE happens to reach in 24 trials depends on the whole search space (any change to it changes
# the seeded sequence), so the seeds make sure every class is met. The bulk one fails too: a
# trial whose parameters are conditional (no stats or blocks_per_sm) must be recorded and never
# retried like any other.
FAILING_SEEDS = (
    KernelConfig(256, 8, 1, "registers", "welford", 1, 8),  # compile
    KernelConfig(256, 8, 2, "registers", "welford", 1, 0),  # launch
    KernelConfig(256, 8, 1, "smem", "two_pass", 1, 0),  # verification
    KernelConfig(256, 8, 2, "bulk", "two_pass", 1, 0, 2),  # launch, bulk-copy kernel
)


def test_failures_are_recorded_and_never_retried(tmp_path):
    path = tmp_path / "s.journal"
    outcomes: dict[int, Outcome] = {}
    first = FakeEvaluator(fail=classify)
    assert all(space.is_valid(c, BF16) and classify(c) for c in FAILING_SEEDS)
    result = tune(
        BF16,
        first,
        storage=str(path),
        study_name="s",
        settings=TuneSettings(n_trials=24, finals_top=0),
        on_trial=lambda c, o, n: outcomes.__setitem__(n, o),
        seeds=FAILING_SEEDS,
        **QUIET,
    )
    assert first.calls[: len(FAILING_SEEDS)] == list(FAILING_SEEDS)
    study = load(path, "s")
    failed = [t for t in study.get_trials(states=[TrialState.FAIL]) if "failure" in t.user_attrs]
    by_class = Counter(t.user_attrs["failure"] for t in failed)
    assert set(by_class) == {"compile", "launch", "verification"}
    assert set(FAILING_SEEDS) <= set(configs_of(failed))
    for trial in failed:
        config = KernelConfig.from_dict(trial.params)
        assert trial.user_attrs["failure"] == classify(config)
        assert trial.user_attrs["error"] == f"fake {classify(config)} failure of {config.label()}"
        assert outcomes[trial.number].status == classify(config)
    assert {k: result.failures[k] for k in by_class} == dict(by_class)
    assert result.evaluated == 24  # failed candidates were measured too: they count

    # A second run on the same study, with every failed config proposed again first.
    failed_configs = set(configs_of(failed))
    for config in failed_configs:
        study.enqueue_trial(config.to_dict())
    second = FakeEvaluator(fail=classify)
    tune(
        BF16,
        second,
        storage=str(path),
        study_name="s",
        settings=TuneSettings(n_trials=36, finals_top=0),
        **QUIET,
    )
    assert len(second.calls) == 12
    assert not failed_configs & set(second.calls)
    assert len(set(first.calls + second.calls)) == 36
    study = load(path, "s")
    duplicates = [t for t in study.trials if t.user_attrs.get("role") == "duplicate"]
    assert set(configs_of(duplicates)) >= failed_configs
    for trial in duplicates:
        original = study.trials[trial.user_attrs["duplicate_of"]]
        assert original.params == trial.params
        if original.state == TrialState.FAIL:
            assert trial.state == TrialState.PRUNED


def test_same_config_twice_in_one_batch_is_measured_once(tmp_path):
    path = tmp_path / "s.journal"
    study = optuna.create_study(
        storage=open_storage(str(path), "s"), study_name="s", direction="minimize"
    )
    good = KernelConfig(256, 8, 1, "registers", "two_pass", 1, 0)
    bad = KernelConfig(256, 8, 1, "none", "two_pass", 1, 0)  # two_pass needs a cache
    for config in (good, good, bad):
        study.enqueue_trial(config.to_dict())
    evaluator = FakeEvaluator()
    tune(
        BF16,
        evaluator,
        storage=str(path),
        study_name="s",
        settings=TuneSettings(n_trials=3, batch=4, finals_top=0),
        **QUIET,
    )
    assert evaluator.calls.count(good) == 1 and bad not in evaluator.calls
    first, copy, invalid = load(path, "s").trials[:3]
    assert first.user_attrs["role"] == "evaluate" and first.value == fake_median_us(good)
    assert copy.user_attrs["role"] == "duplicate" and copy.user_attrs["duplicate_of"] == 0
    assert copy.state == TrialState.COMPLETE and copy.value == first.value
    assert invalid.state == TrialState.PRUNED and "cache" in invalid.user_attrs["error"]


def test_timeout_is_honoured(tmp_path):
    sleep_s, timeout_s = 0.1, 1.5
    evaluator = FakeEvaluator(sleep_s=sleep_s)
    called = time.monotonic()
    result = tune(
        BF16,
        evaluator,
        storage=str(tmp_path / "s.journal"),
        study_name="s",
        settings=TuneSettings(n_trials=200, timeout_s=timeout_s, batch=4, finals_top=0),
        **QUIET,
    )
    starts = [start for start, _ in evaluator.spans]
    # The timeout, not the budget, ended the search: it ran for the whole timeout, and no
    # candidate started after it (its clock starts before the first candidate does). At most
    # one candidate per sleep fits, whatever the load.
    assert 1 <= result.evaluated == len(evaluator.calls) <= timeout_s / sleep_s + 1
    assert result.elapsed_s >= timeout_s
    assert all(start < starts[0] + timeout_s for start in starts)
    # Elapsed is the set-up before the first candidate, the timeout, the candidate in flight and
    # the bookkeeping after it: a few steps like the slowest seen before the first candidate or
    # between two (a busy machine stretches them all alike), with a second to spare.
    setup = starts[0] - called
    gaps = zip(evaluator.spans, evaluator.spans[1:], strict=False)
    between = max((b - a for (_, a), (b, _) in gaps), default=0.0)
    assert result.elapsed_s <= setup + timeout_s + sleep_s + 3 * max(setup, between) + 1.0
    study = load(tmp_path / "s.journal", "s")
    assert not study.get_trials(states=[TrialState.RUNNING])


def test_exhausted_space_stops(tmp_path):
    problem = Problem(hidden=1, dtype="float32")  # a few dozen valid configs of 17280
    valid = set(space.enumerate_space(problem, H200))
    evaluator = FakeEvaluator()
    result = tune(
        problem,
        evaluator,
        storage=str(tmp_path / "s.journal"),
        study_name="s",
        settings=TuneSettings(n_trials=40, finals_top=0, max_idle_asks=40, timeout_s=30),
        **QUIET,
    )
    assert len(evaluator.calls) == len(set(evaluator.calls)) == result.evaluated
    assert set(evaluator.calls) <= valid
    assert result.elapsed_s < 20


# --------------------------------------------------------------------------- resume


def test_resume_after_keyboard_interrupt(tmp_path):
    path = tmp_path / "s.journal"
    settings = TuneSettings(n_trials=12, batch=4, finals_top=0)
    first = FakeEvaluator(interrupt_at=6)
    with pytest.raises(KeyboardInterrupt):
        tune(BF16, first, storage=str(path), study_name="s", settings=settings, **QUIET)
    study = load(path, "s")
    assert not study.get_trials(states=[TrialState.RUNNING])
    done_before = {
        t.number: t.value
        for t in study.get_trials(states=[TrialState.COMPLETE])
        if t.user_attrs["role"] == "evaluate"
    }
    assert len(done_before) == 5
    interrupted = [t for t in study.trials if t.user_attrs.get("failure") == "interrupted"]
    assert configs_of(interrupted) == [first.calls[5]]
    assert interrupted[0].state == TrialState.FAIL

    second = FakeEvaluator()
    result = tune(BF16, second, storage=str(path), study_name="s", settings=settings, **QUIET)
    assert result.evaluated == 12
    study = load(path, "s")
    for number, value in done_before.items():
        assert study.trials[number].state == TrialState.COMPLETE
        assert study.trials[number].value == value
    # Nothing completed was measured twice; only the interrupted one may be measured again.
    calls = Counter(first.calls[:5] + second.calls)
    assert max(calls.values()) == 1
    assert len(second.calls) == 12 - 5


def test_stale_running_trial_blocks_only_while_its_process_lives(tmp_path):
    path = tmp_path / "s.journal"
    config = KernelConfig(256, 8, 1, "registers", "welford", 1, 0)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        number = leave_running_trial(path, "s", config, sleeper.pid)
        load(path, "s").enqueue_trial(config.to_dict())
        evaluator = FakeEvaluator()
        settings = TuneSettings(n_trials=4, batch=2, finals_top=0)
        tune(BF16, evaluator, storage=str(path), study_name="s", settings=settings, **QUIET)
        assert config not in evaluator.calls  # a live process is measuring it
        assert load(path, "s").trials[number].state == TrialState.RUNNING
    finally:
        sleeper.kill()
        sleeper.wait()

    # The owner is dead now (as after kill -9): the next run marks the trial FAIL and retries.
    load(path, "s").enqueue_trial(config.to_dict())
    evaluator = FakeEvaluator()
    settings = TuneSettings(n_trials=6, batch=2, finals_top=0)
    tune(BF16, evaluator, storage=str(path), study_name="s", settings=settings, **QUIET)
    stale = load(path, "s").trials[number]
    assert stale.state == TrialState.FAIL
    assert stale.user_attrs["failure"] == "interrupted"
    assert stale.user_attrs["error"].startswith("stale:")
    assert evaluator.calls.count(config) == 1


def test_trial_of_a_dead_pid_is_stale(tmp_path):
    path = tmp_path / "s.journal"
    config = KernelConfig(128, 8, 1, "registers", "welford", 1, 0)
    number = leave_running_trial(path, "s", config, dead_pid())
    load(path, "s").enqueue_trial(config.to_dict())
    evaluator = FakeEvaluator()
    tune(
        BF16,
        evaluator,
        storage=str(path),
        study_name="s",
        settings=TuneSettings(n_trials=2, batch=2, finals_top=0),
        **QUIET,
    )
    assert load(path, "s").trials[number].state == TrialState.FAIL
    assert config in evaluator.calls


# --------------------------------------------------------------------------- finals

INCUMBENT = KernelConfig(128, 4, 1, "smem", "welford", 1, 0)


@pytest.mark.parametrize(
    ("factor", "cv", "kept"),
    [
        (0.985, 0.005, True),  # 1.5 % faster: inside the 2 % noise
        (0.95, 0.03, True),  # 5 % faster, but the timings scatter by 3 %
        (0.95, 0.005, False),  # 5 % faster and steady
        (0.80, 0.005, False),
    ],
)
def test_finals_keep_the_incumbent_unless_clearly_beaten(tmp_path, factor, cv, kept):
    def retime(config: KernelConfig) -> tuple[float, float]:
        if config == INCUMBENT:
            return 10.0, cv
        return 10.0 * factor + 0.001 * fake_median_us(config), cv

    evaluator = FakeEvaluator(retime_fn=retime)
    result = tune(
        BF16,
        evaluator,
        storage=str(tmp_path / "s.journal"),
        study_name="s",
        settings=TuneSettings(n_trials=6, finals_top=3, finals_rounds=5),
        incumbent=INCUMBENT,
        **QUIET,
    )
    ((contenders, rounds),) = evaluator.retimed
    assert contenders[0] == INCUMBENT and len(set(contenders)) == 4 and rounds == 5
    assert (result.kept == "incumbent") is kept
    if kept:
        assert result.best == INCUMBENT and result.timing.median_us == 10.0
    else:
        fastest = min(contenders[1:], key=fake_median_us)
        assert result.best == fastest and result.timing.median_us < 10.0 * (1 - 0.02)


def test_invalid_incumbent_is_not_defended(tmp_path):
    invalid = KernelConfig(256, 8, 1, "none", "two_pass", 1, 0)
    evaluator = FakeEvaluator()
    result = tune(
        BF16,
        evaluator,
        storage=str(tmp_path / "s.journal"),
        study_name="s",
        settings=TuneSettings(n_trials=4, finals_top=2),
        incumbent=invalid,
        **QUIET,
    )
    ((contenders, _),) = evaluator.retimed
    assert invalid not in contenders and result.best != invalid
    assert result.kept is None


# --------------------------------------------------------------------------- workers


def test_two_workers_share_a_study_without_measuring_twice(tmp_path):
    journal = str(tmp_path / "shared.journal")
    log = tmp_path / "calls.jsonl"
    codes = run_workers(2, tune_worker, (journal, str(log), 24), storage_url=journal, gpus=[0, 1])
    assert codes == [0, 0]
    records = read_log(log)
    assert sorted(r["gpu"] for r in records if r["event"] == "start") == ["0", "1"]
    calls = [tuple(sorted(r["config"].items())) for r in records if r["event"] == "evaluate"]
    assert len(calls) == len(set(calls))
    study = load(Path(journal), WORKER_STUDY)
    measured = [
        t
        for t in study.trials
        if t.user_attrs.get("role") == "evaluate" and t.state == TrialState.COMPLETE
    ]
    assert len(measured) == len(calls) >= 24
    assert not study.get_trials(states=[TrialState.RUNNING])

    # One more call in the parent runs the finals on what the workers found.
    evaluator = FakeEvaluator()
    result = tune(
        WORKER_PROBLEM,
        evaluator,
        storage=journal,
        study_name=WORKER_STUDY,
        settings=TuneSettings(n_trials=24),
        **QUIET,
    )
    assert evaluator.calls == [] and result.evaluated == len(calls)
    assert result.best == min(configs_of(measured), key=fake_median_us)


def test_a_timing_names_the_copy_its_share_divides_by() -> None:
    # The finals divide by a copy timed as they time (single launches), not by the evaluator's
    # back-to-back copy; the CLI and the DB report this one.
    timing = Timing(70.0, 69.0, 71.0, 0.01, gbps=3900.0, share=0.95, samples=20)
    assert timing.copy_gbps == pytest.approx(3900.0 / 0.95)
    assert Timing(70.0, 69.0, 71.0, 0.01, gbps=3900.0).copy_gbps == 0.0  # no share, no copy


def test_a_trial_reclaimed_by_another_process_is_told_without_error():
    # A shared study's heartbeat fails a trial whose process went quiet; when that process
    # comes back and tells its result, the search goes on and the trial stays failed.
    from autonorm.tune.search import _Search

    study = optuna.create_study(storage=optuna.storages.InMemoryStorage())
    trial = study.ask()
    study._storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)
    search = object.__new__(_Search)
    search.study, search.in_flight = study, {trial.number: trial}
    frozen = search._tell(trial, {"role": "evaluate"}, values=[1.0])
    assert frozen.state == optuna.trial.TrialState.FAIL
    assert search.in_flight == {}
