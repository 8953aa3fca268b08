"""Tests of tune_and_store (autonorm.tune.session): search, record, store. CPU only.

The GPU evaluator is replaced by the fake one (tests/fake_evaluator.py) and the device by an
H200's properties, so the whole path runs on a temporary user database without a GPU.
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from fake_evaluator import FakeEvaluator, fake_evaluator_factory, fake_median_us
from optuna.trial import TrialState

from autonorm import lookup
from autonorm.codegen.environment import kernel_digest
from autonorm.ops.layer_norm.family import FAMILY
from autonorm.ops.layer_norm.problem import Problem
from autonorm.runtime.device import DeviceInfo
from autonorm.runtime.limits import H200
from autonorm.store.db import TuningDB, TuningKey
from autonorm.tune import search, session
from autonorm.tune.search import TuneSettings
from autonorm.tune.session import tune_and_store
from autonorm.tune.storage import open_storage

pytestmark = pytest.mark.usefixtures("quiet_optuna")

# An H200 as query_device() describes it: its limits are autonorm's H200 limits.
DEVICE = DeviceInfo(
    name=H200.name, cc=H200.cc, sm_count=H200.sm_count, l2_bytes=H200.l2_bytes,
    smem_optin=H200.max_smem_optin, mem_bus_bits=6144, mem_clock_khz=3201000,
)
PROBLEM = Problem(4096, "bfloat16")
ROWS = 1024
SETTINGS = TuneSettings(n_trials=8, batch=4, finals_top=3, finals_rounds=3)


@pytest.fixture
def user_db(tmp_path, monkeypatch) -> Path:
    """An empty user database and cache directory under tmp_path."""
    monkeypatch.setenv("AUTONORM_DB", str(tmp_path / "user.db"))
    monkeypatch.setenv("AUTONORM_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "user.db"


def digest_of(config) -> str:
    return kernel_digest(FAMILY.render(config, PROBLEM, H200).source)


def run(evaluator: FakeEvaluator, **kwargs):
    """tune_and_store on PROBLEM with ``evaluator``, quietly, on the fake H200."""
    return tune_and_store(
        PROBLEM, ROWS, settings=kwargs.pop("settings", SETTINGS), device=DEVICE,
        evaluator_factory=lambda problem, rows: evaluator, quiet=True, **kwargs,
    )


def favouring(defender, factor: float):
    """A finals retime: 10 us for ``defender``, about ``factor`` of that for the others."""
    def retime(config):
        if config == defender:
            return 10.0, 0.002
        return 10.0 * factor + 0.001 * fake_median_us(config), 0.002

    return retime


def check_finals(tuned, evaluator: FakeEvaluator, defender, kept: bool, user_db: Path) -> None:
    """The defender was re-timed first; it stayed if ``kept``, else the fastest challenger won."""
    ((contenders, _),) = evaluator.retimed
    assert contenders[0] == defender and defender not in contenders[1:]
    if kept:
        assert tuned.config == defender and tuned.timing.median_us == 10.0
    else:
        assert tuned.config == min(contenders[1:], key=fake_median_us)
    with TuningDB(user_db) as db:
        assert db.get_winner(tuned.key).config == tuned.config.to_dict()


def test_the_winner_is_stored_with_its_kernel_digest_and_every_trial_is_recorded(user_db):
    evaluator = FakeEvaluator()
    seen = []
    tuned = run(evaluator, on_trial=lambda c, o, n: seen.append((c, o, n)))
    assert tuned.stored and tuned.db_path == user_db
    assert tuned.config == min(evaluator.calls, key=fake_median_us)
    assert tuned.kernel == digest_of(tuned.config)
    assert tuned.incumbent_kept is False and tuned.evaluated == len(evaluator.calls) == 8
    assert tuned.key == TuningKey.for_problem(DEVICE.fingerprint, PROBLEM, ROWS)
    assert tuned.timing.median_us == fake_median_us(tuned.config)
    # The seeds came first, the family's default among them.
    seeds = FAMILY.seeds(PROBLEM, H200, ROWS)
    assert evaluator.calls[: len(seeds)] == seeds[: len(evaluator.calls)]
    with TuningDB(user_db) as db:
        assert [d["fingerprint"] for d in db.devices()] == [DEVICE.fingerprint]
        winner = db.get_winner(tuned.key)
        assert winner.config == tuned.config.to_dict() and winner.kernel == tuned.kernel
        assert winner.metrics == tuned.metrics
        assert winner.metrics["rows"] == ROWS and winner.metrics["trials"] == 8
        assert winner.metrics["median_us"] == tuned.timing.median_us
        trials = db.trials(tuned.key)
    # Every candidate judged (invalid ones too) is a row, with its trial number and timing.
    assert len(trials) == len(seen) >= 8
    assert [t["trial_number"] for t in trials] == [n for _, _, n in seen]
    assert [t["status"] for t in trials] == [o.status for _, o, _ in seen]
    measured = [t for t in trials if t["status"] == "ok"]
    assert len(measured) == 8
    for row in measured:
        config = FAMILY.config_from_dict(row["config"])
        assert row["median_us"] == fake_median_us(config)


@pytest.mark.parametrize(("factor", "kept"), [(0.99, True), (0.90, False)])
def test_a_second_run_defends_the_incumbent_unless_clearly_beaten(user_db, factor, kept):
    first = run(FakeEvaluator())
    incumbent = first.config
    evaluator = FakeEvaluator(retime_fn=favouring(incumbent, factor))
    second = run(evaluator, settings=TuneSettings(n_trials=12, batch=4, finals_top=3))
    ((contenders, _),) = evaluator.retimed
    assert contenders[0] == incumbent  # defended: it was still valid and renders the same
    assert second.incumbent_kept is kept
    assert second.study == first.study and second.evaluated == 12
    assert len(evaluator.calls) == 4  # the study resumed: 8 measured before, 4 more now
    with TuningDB(user_db) as db:
        winner = db.get_winner(second.key)
    if kept:
        assert second.config == incumbent and second.timing.median_us == 10.0
    else:
        assert second.config != incumbent
        assert second.config == min(contenders[1:], key=fake_median_us)
    assert winner.config == second.config.to_dict()
    assert winner.kernel == second.kernel == digest_of(second.config)


def test_a_winner_whose_kernel_changed_is_not_defended(user_db):
    first = run(FakeEvaluator())
    with TuningDB(user_db) as db:
        db.set_winner(first.key, first.config.to_dict(), first.metrics, "0" * 64)
        assert session.incumbent_of(db, first.key, PROBLEM, H200) is None
        db.set_winner(first.key, first.config.to_dict(), first.metrics, first.kernel)
        assert session.incumbent_of(db, first.key, PROBLEM, H200) == first.config
    # A stale incumbent (kernel digest "0"*64) does not defend: the default does, as where
    # nothing is stored, against the three best challengers.
    with TuningDB(user_db) as db:
        db.set_winner(first.key, first.config.to_dict(), first.metrics, "0" * 64)
    evaluator = FakeEvaluator()
    second = run(evaluator)
    ((contenders, _),) = evaluator.retimed
    assert contenders[0] == FAMILY.default(PROBLEM, H200, ROWS) and len(contenders) == 4
    assert second.incumbent_kept is False
    assert second.kernel == digest_of(second.config)


@pytest.mark.parametrize(("factor", "kept"), [(0.99, True), (0.90, False)])
def test_with_nothing_stored_the_default_defends_unless_clearly_beaten(user_db, factor, kept):
    # Dispatch runs the default where nothing is stored: the finals re-time it beside the
    # challengers, and it stays unless one is faster by more than the noise.
    default = FAMILY.default(PROBLEM, H200, ROWS)
    evaluator = FakeEvaluator(retime_fn=favouring(default, factor))
    tuned = run(evaluator)
    check_finals(tuned, evaluator, default, kept, user_db)
    assert tuned.default_kept is kept and tuned.incumbent_kept is False
    assert tuned.kept_note == (" (default kept)" if kept else "")


def _ship(tmp_path, monkeypatch, config, rows: int, digest: str | None = None) -> None:
    """A shipped database whose one winner, ``config`` at ``rows``, is this fake H200's.

    Its kernel digest is ``config``'s today unless ``digest`` is given (a winner whose kernel's
    code has changed since it was timed).
    """
    from autonorm.store.snapshot import write_snapshot

    with TuningDB(tmp_path / "work.db") as work:
        work.record_device(DEVICE)
        work.set_winner(TuningKey.for_problem(DEVICE.fingerprint, PROBLEM, rows),
                        config.to_dict(), {"median_us": 1.0}, digest or digest_of(config))
        write_snapshot(work, tmp_path / "shipped.db")
    monkeypatch.delenv("AUTONORM_NO_SHIPPED_DB", raising=False)
    monkeypatch.setenv("AUTONORM_SHIPPED_DB", str(tmp_path / "shipped.db"))


@pytest.mark.parametrize(("shipped_rows", "source"),
                         [(ROWS, "shipped"), (4 * ROWS, "shipped-nearest")])
@pytest.mark.parametrize(("factor", "kept"), [(0.99, True), (0.90, False)])
def test_with_nothing_stored_what_dispatch_runs_defends(user_db, tmp_path, monkeypatch,
                                                        shipped_rows, source, factor, kept):
    # Dispatch runs the shipped winner of this key (or of a bucket near it) where the user's
    # database holds none: tuning measures it first and keeps it unless a challenger is
    # clearly faster, so that a tuned winner never runs slower than what ran before.
    default = FAMILY.default(PROBLEM, H200, ROWS)
    pick = next(c for c in FAMILY.seeds(PROBLEM, H200, ROWS)[1:] if c != default)
    _ship(tmp_path, monkeypatch, pick, shipped_rows)
    with TuningDB(user_db) as db, lookup.dispatch_stores(db) as stores:
        running = session.running_pick(stores, PROBLEM, ROWS, DEVICE, H200)
    assert running.config == pick and running.source == source
    evaluator = FakeEvaluator(retime_fn=favouring(pick, factor))
    tuned = run(evaluator)
    assert evaluator.calls[0] == pick  # measured first, before the family's seeds
    check_finals(tuned, evaluator, pick, kept, user_db)
    assert tuned.running_kept is kept and tuned.default_kept is False
    assert tuned.kept_note == (f" ({source} kept)" if kept else "")


def test_with_the_shipped_database_switched_off_the_default_defends(user_db, tmp_path,
                                                                    monkeypatch):
    default = FAMILY.default(PROBLEM, H200, ROWS)
    pick = next(c for c in FAMILY.seeds(PROBLEM, H200, ROWS)[1:] if c != default)
    _ship(tmp_path, monkeypatch, pick, ROWS)
    monkeypatch.setenv("AUTONORM_NO_SHIPPED_DB", "1")
    evaluator = FakeEvaluator()
    tuned = run(evaluator)
    ((contenders, _),) = evaluator.retimed
    assert evaluator.calls[0] == default and contenders[0] == default
    assert tuned.kept in (None, "default")


def test_a_default_that_failed_verification_does_not_defend(user_db):
    default = FAMILY.default(PROBLEM, H200, ROWS)
    evaluator = FakeEvaluator(fail=lambda config: "verification" if config == default else None)
    tuned = run(evaluator)
    ((contenders, _),) = evaluator.retimed
    assert default in evaluator.calls and default not in contenders
    assert tuned.stored and tuned.config != default and tuned.default_kept is False


def test_nothing_verified_stores_nothing(user_db):
    tuned = run(FakeEvaluator(fail=lambda config: "verification"))
    assert not tuned.stored and tuned.config is None and tuned.kernel is None
    assert tuned.failures["verification"] == 8
    with TuningDB(user_db) as db:
        assert db.get_winner(tuned.key) is None
        assert len([t for t in db.trials(tuned.key) if t["status"] == "verification"]) == 8


def test_the_stored_winner_is_the_fastest_that_verified(user_db):
    """The fake timer's fastest kernels (the register cache) fail verification: never stored."""
    evaluator = FakeEvaluator(fail=lambda c: "verification" if c.cache == "registers" else None)
    tuned = run(evaluator)
    wrong = [c for c in evaluator.calls if c.cache == "registers"]
    assert wrong, "the seeds measure register-cache kernels"
    right = [c for c in evaluator.calls if c.cache != "registers"]
    assert tuned.stored and tuned.config == min(right, key=fake_median_us)
    assert fake_median_us(tuned.config) > min(map(fake_median_us, wrong))
    with TuningDB(user_db) as db:
        winner = db.get_winner(tuned.key)
        assert winner.config == tuned.config.to_dict() and winner.kernel == tuned.kernel
        statuses = {FAMILY.config_from_dict(t["config"]): t["status"] for t in db.trials(tuned.key)}
    assert all(statuses[c] == "verification" for c in wrong)


def test_an_open_database_is_written_and_left_open(tmp_path, user_db):
    with TuningDB(tmp_path / "grid.db") as db:
        tuned = run(FakeEvaluator(), store=db)
        assert db.get_winner(tuned.key).kernel == tuned.kernel  # still open
    assert not user_db.exists()


def test_a_worker_passes_the_seeds_for_its_rows(tmp_path, monkeypatch):
    # With workers, the parent's call after them finds the study started, so only worker 0
    # can enqueue the seeds: every worker must be handed them.
    seen = {}
    monkeypatch.setattr(search, "tune", lambda *a, **kw: seen.update(kw))
    problem = Problem(16384, "float32")
    seeds = FAMILY.seeds(problem, H200, 1)
    spec = {
        "problem": problem, "rows": 1, "key": TuningKey.for_problem("gpu", problem, 1),
        "limits": H200, "storage": "x.journal", "study": "s", "seeds": seeds, "quiet": True,
        "settings": TuneSettings(n_trials=4, finals_top=0), "db_path": str(tmp_path / "w.db"),
        "evaluator_factory": fake_evaluator_factory,
    }
    session._tune_worker(0, spec)
    assert seen["seeds"] == seeds and seen["worker_index"] == 0
    assert any(c.cluster == 8 for c in seen["seeds"])  # rows 1: the latency seeds too


def test_two_workers_then_the_finals(tmp_path, user_db):
    journal = str(tmp_path / "shared.journal")
    tuned = tune_and_store(
        PROBLEM, ROWS, settings=TuneSettings(n_trials=12, batch=4, timeout_s=40.0),
        device=DEVICE, storage=journal, workers=2, evaluator_factory=fake_evaluator_factory,
        quiet=True,
    )
    assert tuned.stored and tuned.evaluated >= 12
    study = optuna.load_study(study_name=tuned.study, storage=open_storage(journal, "x"))
    measured = [t for t in study.trials
                if t.user_attrs.get("role") == "evaluate" and t.state == TrialState.COMPLETE]
    best = min((FAMILY.config_from_dict(t.params) for t in measured), key=fake_median_us)
    assert tuned.config == best and tuned.kernel == digest_of(best)
    # Worker 0 enqueued the seeds: the study's first trials, asked by either worker.
    seeds = FAMILY.seeds(PROBLEM, H200, ROWS)
    asked = [t for t in study.trials[: len(seeds)] if t.state != TrialState.WAITING]
    assert len(asked) >= 8
    assert all(FAMILY.config_from_dict(t.params) == seeds[t.number] for t in asked)
    with TuningDB(user_db) as db:
        # The workers recorded their trials in the same database.
        ok = [t for t in db.trials(tuned.key) if t["status"] == "ok"]
        assert len(ok) == len(measured)


def test_bad_arguments_are_refused(user_db):
    with pytest.raises(ValueError, match="rows"):
        tune_and_store(PROBLEM, 0, device=DEVICE, evaluator_factory=fake_evaluator_factory)
    with pytest.raises(ValueError, match="workers"):
        tune_and_store(PROBLEM, ROWS, device=DEVICE, workers=0,
                       evaluator_factory=fake_evaluator_factory)


@pytest.mark.parametrize("where", ["user", "shipped"])
def test_a_winner_whose_kernel_changed_is_measured_right_after_what_runs(
    user_db, tmp_path, monkeypatch, where
):
    # A change of the kernels' code retires a stored winner (its new kernel was never timed,
    # so it does not defend), yet its configuration is the best guess of what wins the key now:
    # tuning again measures it right after what dispatch runs, not only if the search draws it.
    seeds = FAMILY.seeds(PROBLEM, H200, ROWS)
    retired = next(c for c in FAMILY.space(PROBLEM, H200) if c not in seeds)
    key = TuningKey.for_problem(DEVICE.fingerprint, PROBLEM, ROWS)
    if where == "shipped":
        _ship(tmp_path, monkeypatch, retired, ROWS, digest="0" * 64)
    else:
        with TuningDB(user_db) as db:
            db.record_device(DEVICE)
            db.set_winner(key, retired.to_dict(), {"median_us": 1.0}, "0" * 64)
    with TuningDB(user_db) as db, lookup.dispatch_stores(db) as stores:
        running = session.running_pick(stores, PROBLEM, ROWS, DEVICE, H200)
        assert running.config != retired
        assert lookup.retired_configs(stores, key, PROBLEM, H200) == [retired]
    evaluator = FakeEvaluator()
    tuned = run(evaluator)
    assert evaluator.calls[:2] == [running.config, retired]
    ((contenders, _),) = evaluator.retimed
    assert contenders[0] == running.config  # what runs defends; the retired winner does not
    assert tuned.incumbent_kept is False


def test_only_a_winner_whose_kernel_changed_counts_as_retired(user_db):
    # A usable winner is the incumbent, not retired; one the family's rules refuse on this
    # device cannot run at all.
    key = TuningKey.for_problem(DEVICE.fingerprint, PROBLEM, ROWS)
    config = FAMILY.seeds(PROBLEM, H200, ROWS)[1]
    with TuningDB(user_db) as db:
        db.record_device(DEVICE)
        db.set_winner(key, config.to_dict(), {"median_us": 1.0}, digest_of(config))
        assert lookup.retired_configs([db], key, PROBLEM, H200) == []
        refused = config.to_dict() | {"threads": 4096}
        db.set_winner(key, refused, {"median_us": 1.0}, "0" * 64)
        assert lookup.retired_configs([db], key, PROBLEM, H200) == []
