"""Tests of the tuning database (autonorm.store): contract, migration, concurrency, corruption."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import re
import runpy
import shutil
import sqlite3
import warnings
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlite_utils import Database

from autonorm.errors import AutonormError, CorruptDatabaseWarning, DatabaseError
from autonorm.ops.base import problem_key
from autonorm.ops.layer_norm.config import THREADS, KernelConfig
from autonorm.ops.layer_norm.problem import Problem
from autonorm.runtime.device import DeviceInfo
from autonorm.store import schema
from autonorm.store.db import KEY_COLUMNS, SCHEMA_VERSION, STATUSES, TuningDB, TuningKey
from autonorm.store.snapshot import write_snapshot

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SCHEMA_V1 = FIXTURES / "schema_v1.db"

H200 = DeviceInfo("NVIDIA H200", 90, 132, 62914560, 232448, 6144, 3201000)
A100 = DeviceInfo("NVIDIA A100-SXM4-80GB", 80, 108, 41943040, 166912, 5120, 1593000)
KERNEL = "d" * 64  # a kernel digest (its value matters to lookup, not to the database)


def make_key(
    device: str = H200.fingerprint, op: str = "layer_norm", rows_bucket: int = 1024,
    **problem: object,
) -> TuningKey:
    fields = {"hidden": 4096, "dtype": "bfloat16", "has_weight": True, "has_bias": True, **problem}
    return TuningKey(device, op, problem_key(Problem(**fields)), rows_bucket)


def make_metrics(median_us: float = 10.0, rows: int = 1024) -> dict:
    return {
        "median_us": median_us,
        "p20_us": median_us * 0.98,
        "p80_us": median_us * 1.02,
        "cv": 0.01,
        "gbps": 2000.0 / median_us,
        "share": 0.5,
        "max_rel_err": 1e-3,
        "rows": rows,
        "trials": 64,
    }


def assert_utc_timestamp(text: str) -> None:
    assert datetime.fromisoformat(text).utcoffset() == timedelta(0)


def read_raw(path: Path) -> dict[str, list[dict]]:
    """Read every table of a database file through a read-only connection."""
    db = Database(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True))
    try:
        return {name: list(db[name].rows) for name in db.table_names()}
    finally:
        db.close()


@pytest.fixture(params=["file", "memory"])
def tdb(request: pytest.FixtureRequest, tmp_path: Path):
    path = tmp_path / "tuning.db" if request.param == "file" else None
    with TuningDB(path) as db:
        yield db


# -- contract: every backend ------------------------------------------------------------


def test_fresh_db_is_empty_and_current(tdb: TuningDB) -> None:
    assert tdb.schema_version == SCHEMA_VERSION
    assert tdb.devices() == []
    assert tdb.trials() == []
    assert tdb.winners() == []


def test_device_round_trip(tdb: TuningDB) -> None:
    tdb.record_device(H200)
    [row] = tdb.devices()
    first_seen = row.pop("first_seen")
    assert_utc_timestamp(first_seen)
    assert row == {
        "fingerprint": H200.fingerprint,
        "name": "NVIDIA H200",
        "cc": 90,
        "sm_count": 132,
        "l2_bytes": 62914560,
        "smem_optin": 232448,
        "mem_bus_bits": 6144,
        "mem_clock_khz": 3201000,
        "regs_per_sm": 65536,
        "max_threads_per_sm": 2048,
        "smem_per_sm": 233472,
    }
    assert tdb.device_limits(H200.fingerprint) == H200.limits()
    assert tdb.device_limits(A100.fingerprint) is None

    # Backdate first_seen, so that an upsert overwriting it would be visible.
    tdb.db["devices"].update(H200.fingerprint, {"first_seen": "2020-01-01T00:00:00+00:00"})
    changed = dataclasses.replace(H200, smem_optin=200000)
    assert changed.fingerprint == H200.fingerprint
    tdb.record_device(changed)
    tdb.record_device(A100)
    rows = tdb.devices()
    assert [r["fingerprint"] for r in rows] == sorted([A100.fingerprint, H200.fingerprint])
    h200 = next(r for r in rows if r["fingerprint"] == H200.fingerprint)
    assert h200["smem_optin"] == 200000
    assert h200["first_seen"] == "2020-01-01T00:00:00+00:00"
    assert tdb.device_limits(A100.fingerprint) == A100.limits()


def test_trial_round_trip_every_status(tdb: TuningDB) -> None:
    assert set(STATUSES) == {"ok", "invalid", "compile", "launch", "verification"}
    key = make_key()
    other = make_key(hidden=2048)
    sent = []
    for n, status in enumerate(STATUSES):
        config = KernelConfig(threads=THREADS[n]).to_dict()
        metrics = {
            "ok": make_metrics(5.0 + n),
            "verification": {"max_rel_err": 0.31},
        }.get(status)
        error = None if status == "ok" else f"{status} failed"
        trial_id = tdb.record_trial(
            key, config, status, error=error, metrics=metrics, study="study-a", trial_number=n
        )
        sent.append((trial_id, status, config, metrics, error, n))
    other_id = tdb.record_trial(other, KernelConfig().to_dict(), "ok", metrics=make_metrics())

    ids = [s[0] for s in sent]
    assert ids == sorted(ids)
    assert len(set(ids + [other_id])) == len(STATUSES) + 1

    rows = tdb.trials(key)
    assert [r["id"] for r in rows] == ids
    for row, (_, status, config, metrics, error, n) in zip(rows, sent, strict=True):
        assert row["status"] == status
        assert row["error"] == error
        assert row["config"] == config
        assert row["label"] == KernelConfig.from_dict(config).label()
        assert row["metrics"] == metrics
        assert (row["study"], row["trial_number"]) == ("study-a", n)
        assert {c: row[c] for c in KEY_COLUMNS} == dataclasses.asdict(key)
        assert (row["op"], row["dtype"], row["hidden"]) == ("layer_norm", "bfloat16", 4096)
        assert row["legacy_version"] is None
        for column in ("median_us", "gbps", "share", "max_rel_err"):
            assert row[column] == (metrics or {}).get(column), column
        assert_utc_timestamp(row["created_at"])
    assert rows[0]["median_us"] == 5.0
    assert rows[-1]["max_rel_err"] == 0.31

    assert [r["id"] for r in tdb.trials(other)] == [other_id]
    assert [r["id"] for r in tdb.trials()] == ids + [other_id]
    assert tdb.trials(make_key(dtype="float16")) == []


def test_record_outcome_keeps_the_timing(tdb: TuningDB) -> None:
    from autonorm.results import Outcome, Timing

    key = make_key()
    timed = Outcome("ok", Timing(70.5, 70.1, 71.0, 0.01, 3800.0, 0.92, 30), max_rel_err=1.7e-3)
    failed = Outcome("verification", error="offset: 0.3 > 8e-3", max_rel_err=0.3)
    tdb.record_outcome(key, KernelConfig(threads=128, max_regs=64), timed, trial_number=4)
    tdb.record_outcome(key, KernelConfig(), failed)
    ok, bad = tdb.trials(key)
    assert ok["status"] == "ok" and ok["trial_number"] == 4
    assert ok["label"] == "t128v8r1-registers-welford-c1-p0-m64"
    assert (ok["median_us"], ok["gbps"], ok["share"], ok["max_rel_err"]) == (70.5, 3800.0, 0.92,
                                                                             1.7e-3)
    assert ok["metrics"] == {**timed.timing.metrics(), "max_rel_err": 1.7e-3}
    # A failure keeps its error; with no timing there are no metrics (its max_rel_err included).
    assert (bad["status"], bad["error"], bad["metrics"]) == ("verification",
                                                              "offset: 0.3 > 8e-3", None)


def test_record_trial_rejects_unknown_status(tdb: TuningDB) -> None:
    with pytest.raises(ValueError, match="status"):
        tdb.record_trial(make_key(), KernelConfig().to_dict(), "timeout")
    assert tdb.trials() == []


def test_partial_config_gets_a_plain_label(tdb: TuningDB) -> None:
    tdb.record_trial(make_key(), {"vec": 4, "threads": 128}, "invalid", error="bad")
    [row] = tdb.trials()
    assert row["label"] == "threads=128,vec=4"
    assert row["metrics"] is None


def test_winner_upsert_replaces(tdb: TuningDB) -> None:
    key = make_key()
    first = KernelConfig(threads=256).to_dict()
    second = KernelConfig(threads=512, cache="smem").to_dict()
    tdb.set_winner(key, first, make_metrics(10.0), KERNEL)
    tdb.set_winner(key, second, make_metrics(8.0), KERNEL)
    winner = tdb.get_winner(key)
    assert winner is not None
    assert winner.key == key
    assert winner.config == second
    assert winner.metrics == make_metrics(8.0)
    assert winner.source == "user"
    assert (winner.kernel, winner.legacy_version) == (KERNEL, None)
    assert_utc_timestamp(winner.tuned_at)
    assert tdb.winners() == [winner]
    tdb.set_winner(key, first, make_metrics(9.0), "e" * 64)  # a re-tune records its kernel
    assert tdb.get_winner(key).kernel == "e" * 64


def test_a_winner_needs_its_kernel(tdb: TuningDB) -> None:
    for missing in ("", None):
        with pytest.raises(ValueError, match="digest"):
            tdb.set_winner(make_key(), KernelConfig().to_dict(), make_metrics(), missing)
    assert tdb.winners() == []


def test_get_winner_needs_the_exact_key(tdb: TuningDB) -> None:
    small = KernelConfig(threads=128).to_dict()
    large = KernelConfig(threads=1024).to_dict()
    tdb.set_winner(make_key(rows_bucket=256), small, make_metrics(rows=200), KERNEL)
    tdb.set_winner(make_key(rows_bucket=1024), large, make_metrics(rows=1000), KERNEL)
    assert tdb.get_winner(make_key(rows_bucket=256)).config == small
    assert tdb.get_winner(make_key(rows_bucket=1024)).config == large
    for miss in (
        make_key(rows_bucket=512),
        make_key(dtype="float16"),
        make_key(hidden=4097),
        make_key(has_weight=False),
        make_key(has_bias=False),
        make_key(op="rms_norm"),
        make_key(device=A100.fingerprint),
    ):
        assert tdb.get_winner(miss) is None, miss


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (16, 16),  # exact
        (32, 64),  # tie between 16 and 64: the larger bucket
        (8, 16),  # tie between 4 and 16: the larger bucket
        (2, 4),
        (1, 4),
        (128, 64),
        (1 << 20, 64),
    ],
)
def test_nearest_winner(tdb: TuningDB, target: int, expected: int) -> None:
    for bucket in (4, 16, 64):
        tdb.set_winner(
            make_key(rows_bucket=bucket), KernelConfig(threads=bucket * 2).to_dict(), {"b": bucket},
            KERNEL,
        )
    winner = tdb.nearest_winner(make_key(rows_bucket=target))
    assert winner is not None
    assert winner.key.rows_bucket == expected
    assert winner.config == KernelConfig(threads=expected * 2).to_dict()


def test_nearest_winner_stays_within_the_problem(tdb: TuningDB) -> None:
    tdb.set_winner(make_key(rows_bucket=64), KernelConfig().to_dict(), make_metrics(), KERNEL)
    assert tdb.nearest_winner(make_key(rows_bucket=4096)) is not None
    for other in (
        make_key(hidden=2048),
        make_key(dtype="float32"),
        make_key(has_weight=False),
        make_key(has_bias=False),
        make_key(op="rms_norm"),
        make_key(device=A100.fingerprint),
    ):
        assert tdb.nearest_winner(other) is None, other
        assert tdb.winners_by_distance(other) == [], other


def test_winners_by_distance_lists_every_bucket_nearest_first(tdb: TuningDB) -> None:
    for bucket in (4, 16, 64, 1024):
        tdb.set_winner(make_key(rows_bucket=bucket), KernelConfig().to_dict(), {"b": bucket},
                       KERNEL)
    tdb.set_winner(make_key(hidden=2048, rows_bucket=32), KernelConfig().to_dict(), {}, KERNEL)
    ranked = [w.key.rows_bucket for w in tdb.winners_by_distance(make_key(rows_bucket=32))]
    assert ranked == [64, 16, 4, 1024]  # 64 and 16 tie: the larger first
    assert [w.key.rows_bucket for w in tdb.winners_by_distance(make_key(rows_bucket=16))] == [
        16, 64, 4, 1024]


def test_winners_are_listed_by_dtype_hidden_bucket(tdb: TuningDB) -> None:
    inserted = [
        ("float32", 1024, 8),
        ("bfloat16", 4096, 64),
        ("float16", 512, 1),
        ("bfloat16", 768, 2048),
        ("bfloat16", 4096, 2),
        ("float32", 1024, 1),
    ]
    assert inserted != sorted(inserted)
    for dtype, hidden, bucket in inserted:
        key = make_key(dtype=dtype, hidden=hidden, rows_bucket=bucket)
        tdb.set_winner(key, KernelConfig().to_dict(), make_metrics(), KERNEL)
    a100 = make_key(device=A100.fingerprint)
    tdb.set_winner(a100, KernelConfig().to_dict(), make_metrics(), KERNEL)

    tdb.set_winner(make_key(op="rms_norm"), KernelConfig().to_dict(), make_metrics(), KERNEL)

    listed = [(w.key.dtype, w.key.hidden, w.key.rows_bucket)
              for w in tdb.winners(H200.fingerprint, "layer_norm")]
    assert listed == sorted(inserted)
    assert len(tdb.winners()) == len(inserted) + 2
    assert len(tdb.winners(H200.fingerprint)) == len(inserted) + 1
    assert [w.key.device for w in tdb.winners(A100.fingerprint)] == [A100.fingerprint]
    assert [w.key.op for w in tdb.winners(op="rms_norm")] == ["rms_norm"]
    problem = make_key(dtype="float32", hidden=1024).problem
    assert [w.key.rows_bucket for w in tdb.winners(problem=problem)] == [1, 8]


def test_colon_memory_is_an_in_memory_db() -> None:
    with TuningDB(":memory:") as db:
        assert db.path is None
        db.set_winner(make_key(), KernelConfig().to_dict(), make_metrics(), KERNEL)
        assert len(db.winners()) == 1


def test_tuning_key_of_a_problem() -> None:
    problem = Problem(4096, "bf16", True, False)
    key = TuningKey.for_problem(H200.fingerprint, problem, 1000)
    assert key == TuningKey(
        H200.fingerprint, "layer_norm",
        '{"dtype":"bfloat16","has_bias":false,"has_weight":true,"hidden":4096}', 1024,
    )
    assert key.fields == {"dtype": "bfloat16", "has_bias": False, "has_weight": True,
                          "hidden": 4096}
    assert (key.dtype, key.hidden) == ("bfloat16", 4096)
    assert TuningKey.for_problem(H200.fingerprint, problem, 0).rows_bucket == 1


def test_tuning_key_validates() -> None:
    def raw(problem: str, rows_bucket: int = 1024, op: str = "layer_norm") -> TuningKey:
        return TuningKey(H200.fingerprint, op, problem, rows_bucket)

    with pytest.raises(ValueError, match="dtype"):
        raw('{"dtype":"bf16","hidden":4096}')
    with pytest.raises(ValueError, match="power of two"):
        make_key(rows_bucket=48)
    with pytest.raises(ValueError, match="hidden"):
        make_key(hidden=0)
    with pytest.raises(ValueError, match="hidden"):
        raw('{"dtype":"float32","hidden":0}')
    with pytest.raises(ValueError, match="hidden"):
        raw('{"dtype":"float32"}')
    with pytest.raises(ValueError, match="canonical"):
        raw('{"hidden":4096,"dtype":"float32"}')  # keys not sorted
    with pytest.raises(ValueError, match="canonical"):
        raw('{"dtype": "float32", "hidden": 4096}')  # not compact
    with pytest.raises(ValueError, match="JSON"):
        raw("float32 4096")
    with pytest.raises(ValueError, match="object"):
        raw("[4096]")
    with pytest.raises(ValueError, match="op"):
        raw('{"dtype":"float32","hidden":4096}', op="")
    assert raw('{"dtype":"float32","hidden":4096}').hidden == 4096


# -- migrations ----------------------------------------------------------------------------


def test_v1_fixture_holds_the_old_schema() -> None:
    old = read_raw(SCHEMA_V1)
    assert old["meta"] == [{"key": "schema_version", "value": "1"}]
    assert (len(old["devices"]), len(old["trials"]), len(old["winners"])) == (2, 8, 3)
    assert "share" not in old["trials"][0] and "max_rel_err" not in old["trials"][0]
    assert {"median_us", "gbps"} <= old["winners"][0].keys()
    assert "metrics" not in old["winners"][0]


def test_fixture_script_rebuilds_the_fixture(tmp_path: Path) -> None:
    rebuilt = tmp_path / "rebuilt.db"
    runpy.run_path(str(FIXTURES / "make_schema_v1.py"))["build"](rebuilt)
    assert read_raw(rebuilt) == read_raw(SCHEMA_V1)


def _v2_problem(row: dict) -> str:
    """The v3 problem column of a v1 or v2 row: its LayerNorm problem's canonical JSON."""
    problem = Problem(row["hidden"], row["dtype"], bool(row["has_weight"]), bool(row["has_bias"]))
    return problem_key(problem)


def test_opening_v1_writable_migrates_every_row(tmp_path: Path) -> None:
    old = read_raw(SCHEMA_V1)
    path = tmp_path / "old.db"
    shutil.copyfile(SCHEMA_V1, path)

    with TuningDB(path) as db:
        assert db.schema_version == 3
        trial_columns = db.db["trials"].columns_dict.keys()
        assert {"share", "max_rel_err", "op", "problem", "legacy_version"} <= trial_columns
        assert not {"version", "has_weight", "has_bias"} & trial_columns
        winner_columns = db.db["winners"].columns_dict.keys()
        assert {"metrics", "kernel", "legacy_version", "op", "problem"} <= winner_columns
        assert not {"median_us", "gbps", "version", "has_weight", "has_bias"} & winner_columns

        per_sm = dict.fromkeys(schema.DEVICE_LIMIT_COLUMNS)
        assert db.devices() == sorted(({**d, **per_sm} for d in old["devices"]),
                                      key=lambda d: d["fingerprint"])
        old_h200 = old["devices"][0]
        assert db.device_limits(old_h200["fingerprint"]).max_smem_optin == old_h200["smem_optin"]

        migrated = {row["id"]: row for row in db.trials()}
        assert sorted(migrated) == sorted(row["id"] for row in old["trials"])
        for before in old["trials"]:
            after = migrated[before["id"]]
            assert (after["op"], after["problem"]) == ("layer_norm", _v2_problem(before))
            assert after["legacy_version"] == before["version"]
            for column, value in before.items():
                if column in ("config", "metrics"):
                    assert after[column] == (json.loads(value) if value else None), column
                elif column not in ("version", "has_weight", "has_bias"):
                    assert after[column] == value, column
            old_metrics = json.loads(before["metrics"]) if before["metrics"] else {}
            assert after["share"] == old_metrics.get("share")
            assert after["max_rel_err"] == old_metrics.get("max_rel_err")
        assert sum(r["share"] is not None for r in migrated.values()) == 4
        assert sum(r["max_rel_err"] is not None for r in migrated.values()) == 5

        for before in old["winners"]:
            key = TuningKey(before["device"], "layer_norm", _v2_problem(before),
                            before["rows_bucket"])
            winner = db.get_winner(key)
            assert winner is not None, key
            assert winner.config == json.loads(before["config"])
            assert winner.metrics == {"median_us": before["median_us"], "gbps": before["gbps"]}
            assert winner.tuned_at == before["tuned_at"]
            assert (winner.kernel, winner.legacy_version) == (None, before["version"])
        assert len(db.winners()) == len(old["winners"])
        assert db.db["winners_v2"].count == 0  # no two old winners shared a new key

        # The migrated file takes new rows, after the old ones.
        new_id = db.record_trial(make_key(), KernelConfig().to_dict(), "ok", metrics=make_metrics())
        assert new_id > max(migrated)
        db.set_winner(make_key(), KernelConfig().to_dict(), make_metrics(), KERNEL)

    with TuningDB(path) as db:  # a second open finds it current and leaves it alone
        assert db.schema_version == 3
        assert len(db.trials()) == len(old["trials"]) + 1
        assert len(db.winners()) == len(old["winners"]) + 1


# The schema 2 tables, as autonorm 0.1.0 created them (a frozen record: autonorm moves on).
V2_TABLES = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE devices (fingerprint TEXT PRIMARY KEY, name TEXT NOT NULL, cc INTEGER,
    sm_count INTEGER, l2_bytes INTEGER, smem_optin INTEGER, mem_bus_bits INTEGER,
    mem_clock_khz INTEGER, first_seen TEXT NOT NULL);
CREATE TABLE trials (id INTEGER PRIMARY KEY, device TEXT NOT NULL, version TEXT NOT NULL,
    dtype TEXT NOT NULL, hidden INTEGER NOT NULL, has_weight INTEGER NOT NULL,
    has_bias INTEGER NOT NULL, rows_bucket INTEGER NOT NULL, study TEXT, trial_number INTEGER,
    config TEXT NOT NULL, label TEXT NOT NULL, status TEXT NOT NULL, error TEXT, metrics TEXT,
    median_us REAL, gbps REAL, share REAL, max_rel_err REAL, created_at TEXT NOT NULL);
CREATE INDEX idx_trials_key ON trials (device, version, dtype, hidden, has_weight, has_bias,
    rows_bucket);
CREATE TABLE winners (device TEXT, version TEXT, dtype TEXT, hidden INTEGER, has_weight INTEGER,
    has_bias INTEGER, rows_bucket INTEGER, config TEXT NOT NULL, metrics TEXT NOT NULL,
    tuned_at TEXT NOT NULL,
    PRIMARY KEY (device, version, dtype, hidden, has_weight, has_bias, rows_bucket));
INSERT INTO meta VALUES ('schema_version', '2');
"""

# The last version before winners recorded their kernel (LayerNorm's legacy_versions), an
# older one, and a row tuned with each.
TRUSTED = "0.1.0+96473fff10af"
OLDER = "0.1.0+0551568b527c"


def _make_v2(path: Path) -> dict[str, list[dict]]:
    """Write a schema 2 database with two versions' winners of one key; return its rows."""
    conn = sqlite3.connect(path)
    conn.executescript(V2_TABLES)
    config = json.dumps(KernelConfig(threads=256).to_dict())
    older_config = json.dumps(KernelConfig(threads=512).to_dict())
    conn.execute(
        "INSERT INTO devices VALUES (?, 'NVIDIA H200', 90, 132, 62914560, 232448, 6144, "
        "3201000, '2026-10-01T08:00:00+00:00')", [H200.fingerprint]
    )
    trials = [
        (1, TRUSTED, "bfloat16", 4096, 1, 1, 1024, config, "ok", '{"median_us": 9.5}', 9.5),
        (2, OLDER, "float16", 768, 1, 0, 64, older_config, "compile", None, None),
    ]
    for n, version, dtype, hidden, w, b, bucket, cfg, status, metrics, median in trials:
        conn.execute(
            "INSERT INTO trials (id, device, version, dtype, hidden, has_weight, has_bias, "
            "rows_bucket, study, trial_number, config, label, status, metrics, median_us, "
            "created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 's', ?, ?, 'l', ?, ?, ?, "
            "'2026-10-01T10:00:00+00:00')",
            [n, H200.fingerprint, version, dtype, hidden, w, b, bucket, n, cfg, status, metrics,
             median],
        )
    winners = [  # (version, hidden, bucket, config, tuned_at)
        (OLDER, 4096, 1024, older_config, "2026-10-01T10:00:00+00:00"),
        (TRUSTED, 4096, 1024, config, "2026-11-30T10:00:00+00:00"),  # the same key, later
        (OLDER, 8192, 1024, older_config, "2026-10-01T11:00:00+00:00"),
    ]
    for version, hidden, bucket, cfg, tuned_at in winners:
        conn.execute(
            "INSERT INTO winners VALUES (?, ?, 'bfloat16', ?, 1, 1, ?, ?, ?, ?)",
            [H200.fingerprint, version, hidden, bucket, cfg, '{"median_us": 1.0}', tuned_at],
        )
    conn.commit()
    conn.close()
    return read_raw(path)


def test_opening_v2_writable_migrates_every_row(tmp_path: Path) -> None:
    path = tmp_path / "v2.db"
    old = _make_v2(path)
    with TuningDB(path) as db:
        assert db.schema_version == 3
        [device] = db.devices()
        assert device["smem_optin"] == 232448 and device["regs_per_sm"] is None
        trials = db.trials()
        assert [t["id"] for t in trials] == [1, 2]
        assert [t["legacy_version"] for t in trials] == [TRUSTED, OLDER]
        assert trials[0]["problem"] == problem_key(Problem(4096, "bfloat16"))
        assert trials[1]["problem"] == problem_key(Problem(768, "float16", True, False))
        assert (trials[0]["median_us"], trials[0]["metrics"]) == (9.5, {"median_us": 9.5})
        assert db.trials(make_key()) == [trials[0]]  # the migrated key is today's key

        # One winner per new key: of the two versions of bf16 4096, the later one.
        winners = db.winners()
        assert [(w.key.hidden, w.legacy_version) for w in winners] == [
            (4096, TRUSTED), (8192, OLDER)]
        assert db.get_winner(make_key()).config == KernelConfig(threads=256).to_dict()
        assert all(w.kernel is None for w in winners)
        # ...and the other is kept, unchanged, in winners_v2.
        [kept] = db.db["winners_v2"].rows
        assert kept == next(w for w in old["winners"] if w["version"] == OLDER
                            and w["hidden"] == 4096)
        assert len(winners) + 1 == len(old["winners"])


def test_only_trusted_legacy_winners_are_used(tmp_path: Path) -> None:
    from autonorm import lookup

    path = tmp_path / "v2.db"
    _make_v2(path)
    device = lookup.Device(H200.fingerprint, H200.limits())
    with TuningDB(path) as db:
        trusted = db.get_winner(make_key())
        stale = db.get_winner(make_key(hidden=8192))
        assert lookup.verdict(trusted, Problem(4096), H200.limits())[0] == lookup.USABLE
        assert lookup.verdict(stale, Problem(8192), H200.limits())[0] == lookup.STALE
        choice = lookup.choose(Problem(4096), 1000, device, [db])
        assert (choice.source, choice.config) == ("user", KernelConfig(threads=256))
        assert choice.winner == trusted
        assert lookup.choose(Problem(8192), 1000, device, [db]).source == "default"


def test_a_damaged_winner_row_costs_its_winner_not_the_lookup(tmp_path: Path) -> None:
    from autonorm import lookup

    path = tmp_path / "damaged.db"
    device = lookup.Device(H200.fingerprint, H200.limits())
    with TuningDB(path) as db:
        db.set_winner(make_key(), KernelConfig(threads=256).to_dict(), make_metrics(), KERNEL)
    raw = sqlite3.connect(path)
    raw.execute("UPDATE winners SET config = '{not json', metrics = '[1'")
    raw.commit()
    raw.close()
    with TuningDB(path) as db:
        [winner] = db.winners()
        assert (winner.config, winner.metrics) == ({}, {})
        assert lookup.choose(Problem(4096), 1000, device, [db]).source == "default"


@pytest.mark.parametrize("step", [1, 2])
def test_failed_migration_leaves_the_file_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: int
) -> None:
    path = tmp_path / "old.db"
    shutil.copyfile(SCHEMA_V1, path)
    before = read_raw(path)
    real = schema.MIGRATIONS[step]

    def migrate_then_fail(db: Database) -> None:
        real(db)
        raise RuntimeError("power cut")

    monkeypatch.setitem(schema.MIGRATIONS, step, migrate_then_fail)
    with pytest.raises(RuntimeError, match="power cut"):
        TuningDB(path)
    assert read_raw(path) == before == read_raw(SCHEMA_V1)


def test_read_only_v2_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "v2.db"
    _make_v2(path)
    data = path.read_bytes()
    with pytest.raises(DatabaseError, match="schema version 2"):
        TuningDB(path, read_only=True)
    assert path.read_bytes() == data


def test_read_only_v1_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    shutil.copyfile(SCHEMA_V1, path)
    with pytest.raises(DatabaseError, match="schema version 1"):
        TuningDB(path, read_only=True)
    assert path.read_bytes() == SCHEMA_V1.read_bytes()


@pytest.mark.parametrize("read_only", [False, True])
def test_newer_schema_raises(tmp_path: Path, read_only: bool) -> None:
    path = tmp_path / "future.db"
    with TuningDB(path) as db:
        db.record_trial(make_key(), KernelConfig().to_dict(), "ok")
        db.db["meta"].update("schema_version", {"value": str(SCHEMA_VERSION + 1)})
    with pytest.raises(DatabaseError, match="newer") as info:
        TuningDB(path, read_only=read_only)
    assert isinstance(info.value, AutonormError)
    assert str(path) in str(info.value)
    raw = read_raw(path)
    assert raw["meta"] == [{"key": "schema_version", "value": str(SCHEMA_VERSION + 1)}]
    assert len(raw["trials"]) == 1


@pytest.mark.parametrize("read_only", [False, True])
def test_an_unreadable_schema_version_names_the_file(tmp_path: Path, read_only: bool) -> None:
    path = tmp_path / "odd.db"
    with TuningDB(path) as db:
        db.db["meta"].update("schema_version", {"value": "two"})
    with pytest.raises(DatabaseError) as info:
        TuningDB(path, read_only=read_only)
    assert str(info.value) == (
        f"tuning database {path} has an unreadable schema_version 'two' (not a number)"
    )
    assert read_raw(path)["meta"] == [{"key": "schema_version", "value": "two"}]


def test_foreign_sqlite_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    Database(path)["notes"].insert({"text": "not autonorm"}).db.close()
    with pytest.raises(DatabaseError, match="not an autonorm"):
        TuningDB(path)
    assert read_raw(path) == {"notes": [{"text": "not autonorm"}]}


# -- concurrency ---------------------------------------------------------------------------

WORKERS = 4
TRIALS_EACH = 100
WINNERS_EACH = 10


def _write_concurrently(path: str, worker: int, barrier) -> None:  # noqa: ANN001
    """Run in a child process: open the (possibly new) file at once with the others, write."""
    barrier.wait(timeout=60)
    with TuningDB(path) as db:
        hidden = 1024 * (worker + 1)
        for i in range(TRIALS_EACH):
            db.record_trial(
                make_key(hidden=hidden),
                KernelConfig().to_dict(),
                "ok",
                metrics=make_metrics(float(i + 1)),
                study=f"worker-{worker}",
                trial_number=i,
            )
            if i % (TRIALS_EACH // WINNERS_EACH) == 0:
                bucket = 1 << (i // (TRIALS_EACH // WINNERS_EACH))
                db.set_winner(
                    make_key(hidden=hidden, rows_bucket=bucket),
                    KernelConfig().to_dict(),
                    make_metrics(float(i + 1)),
                    KERNEL,
                )


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(WORKERS)
    procs = [
        ctx.Process(target=_write_concurrently, args=(str(path), w, barrier))
        for w in range(WORKERS)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    assert [proc.exitcode for proc in procs] == [0] * WORKERS

    with TuningDB(path) as db:
        trials = db.trials()
        assert len(trials) == WORKERS * TRIALS_EACH
        assert {(t["study"], t["trial_number"]) for t in trials} == {
            (f"worker-{w}", i) for w in range(WORKERS) for i in range(TRIALS_EACH)
        }
        winners = {(w.key.hidden, w.key.rows_bucket) for w in db.winners()}
        assert winners == {
            (1024 * (w + 1), 1 << j) for w in range(WORKERS) for j in range(WINNERS_EACH)
        }
        assert db.db.journal_mode == "wal"


# -- corruption ----------------------------------------------------------------------------

GARBAGE = b"this is not an SQLite database, just some bytes\n" * 200


def open_expecting_rotation(path: Path) -> tuple[TuningDB, Path]:
    """Open ``path``, which must be set aside with one warning; return the DB and the aside."""
    with pytest.warns(CorruptDatabaseWarning) as record:
        db = TuningDB(path)
    messages = [str(w.message) for w in record if w.category is CorruptDatabaseWarning]
    assert len(messages) == 1
    pattern = re.escape(path.name) + r"\.corrupt-\d{8}T\d{6}Z"
    [aside] = [p for p in path.parent.iterdir() if re.fullmatch(pattern, p.name)]
    assert str(path) in messages[0]
    assert str(aside) in messages[0]
    return db, aside


def assert_fresh_and_working(db: TuningDB) -> None:
    assert db.schema_version == SCHEMA_VERSION
    assert db.trials() == []
    db.record_trial(make_key(), KernelConfig().to_dict(), "ok", metrics=make_metrics())
    db.set_winner(make_key(), KernelConfig().to_dict(), make_metrics(), KERNEL)
    assert len(db.trials()) == 1
    assert db.get_winner(make_key()) is not None


def test_garbage_file_is_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "user.db"
    path.write_bytes(GARBAGE)

    db, aside = open_expecting_rotation(path)
    with db:
        assert aside.read_bytes() == GARBAGE
        assert_fresh_and_working(db)

    with warnings.catch_warnings():
        warnings.simplefilter("error", CorruptDatabaseWarning)
        with TuningDB(path) as db:  # the fresh file is healthy: no second rotation
            assert len(db.trials()) == 1


@pytest.mark.parametrize("keep", ["half", "first_page_part"])
def test_truncated_db_is_set_aside(tmp_path: Path, keep: str) -> None:
    path = tmp_path / "user.db"
    with TuningDB(path) as db:
        for i in range(200):
            db.record_trial(make_key(), KernelConfig().to_dict(), "compile", error=f"{i}" * 500)
    assert not path.with_name("user.db-wal").exists()  # checkpointed on close
    data = path.read_bytes()
    assert len(data) > 25 * 4096
    truncated = data[: len(data) // 2] if keep == "half" else data[:3000]
    path.write_bytes(truncated)

    db, aside = open_expecting_rotation(path)
    with db:
        assert aside.read_bytes() == truncated
        assert_fresh_and_working(db)


def test_read_only_garbage_raises(tmp_path: Path) -> None:
    path = tmp_path / "shipped.db"
    path.write_bytes(GARBAGE)
    with pytest.raises(DatabaseError, match="corrupt") as info:
        TuningDB(path, read_only=True, immutable=True)
    assert str(path) in str(info.value)
    assert path.read_bytes() == GARBAGE
    assert [p.name for p in tmp_path.iterdir()] == ["shipped.db"]


def test_unopenable_path_raises(tmp_path: Path) -> None:
    with pytest.raises(DatabaseError, match=re.escape(str(tmp_path))):
        TuningDB(tmp_path)  # a directory


def test_read_only_missing_file_raises(tmp_path: Path) -> None:
    path = tmp_path / "absent.db"
    with pytest.raises(DatabaseError, match="does not exist"):
        TuningDB(path, read_only=True)
    assert not path.exists()


# -- read-only -----------------------------------------------------------------------------


@pytest.mark.parametrize("immutable", [True, False])
def test_read_only_never_writes(tmp_path: Path, immutable: bool) -> None:
    path = tmp_path / "shipped.db"
    key = make_key(rows_bucket=64)
    config = KernelConfig(threads=512).to_dict()
    with TuningDB(path) as db:
        db.record_device(H200)
        db.record_trial(key, config, "ok", metrics=make_metrics())
        db.set_winner(key, config, make_metrics(), KERNEL)
    before = (path.read_bytes(), path.stat().st_mtime_ns)

    with TuningDB(path, read_only=True, immutable=immutable) as db:
        assert db.get_winner(key).config == config
        assert db.nearest_winner(make_key(rows_bucket=1024)).key == key
        assert len(db.trials(key)) == 1
        assert [d["fingerprint"] for d in db.devices()] == [H200.fingerprint]
        writes = [
            lambda: db.record_device(A100),
            lambda: db.record_trial(key, config, "ok"),
            lambda: db.set_winner(key, KernelConfig().to_dict(), make_metrics(), KERNEL),
        ]
        for write in writes:
            with pytest.raises(DatabaseError, match="read-only"):
                write()
        # Even a write past the API is refused by SQLite itself (mode=ro).
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            db.db.execute("DELETE FROM winners")
        assert db.get_winner(key) is not None

    assert (path.read_bytes(), path.stat().st_mtime_ns) == before


def test_open_user_creates_parent_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "cache" / "autonorm" / "autonorm.db"
    monkeypatch.setenv("AUTONORM_DB", str(path))
    with TuningDB.open_user() as db:
        assert db.path == path
        assert not db.read_only
        db.record_trial(make_key(), KernelConfig().to_dict(), "ok")
    assert path.is_file()


def test_open_shipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "shipped.db"
    with TuningDB(path) as db:
        db.set_winner(make_key(), KernelConfig().to_dict(), make_metrics(), KERNEL)

    monkeypatch.delenv("AUTONORM_NO_SHIPPED_DB", raising=False)
    monkeypatch.setenv("AUTONORM_SHIPPED_DB", str(tmp_path / "missing.db"))
    assert TuningDB.open_shipped() is None

    monkeypatch.setenv("AUTONORM_SHIPPED_DB", str(path))
    with TuningDB.open_shipped() as db:
        assert db.read_only
        assert db.get_winner(make_key()).source == "shipped"
        with pytest.raises(DatabaseError, match="read-only"):
            db.set_winner(make_key(), KernelConfig().to_dict(), make_metrics(), KERNEL)

    monkeypatch.setenv("AUTONORM_NO_SHIPPED_DB", "1")
    assert TuningDB.open_shipped() is None


# -- snapshot (how the shipped database is written) ------------------------------------------


def test_snapshot_is_one_file_of_winners_and_devices(tmp_path: Path) -> None:
    source = tmp_path / "user.db"
    with TuningDB(source) as db:
        db.record_device(H200)
        for _ in range(50):
            db.record_trial(make_key(), KernelConfig().to_dict(), "compile", error="x" * 400)
        db.set_winner(make_key(), KernelConfig(threads=512).to_dict(), make_metrics(), KERNEL)
        db.set_winner(make_key(rows_bucket=1), KernelConfig().to_dict(), make_metrics(), KERNEL)
        dest = write_snapshot(db, tmp_path / "s.db")
        winners, devices = db.winners(), db.devices()
        with_trials = write_snapshot(db, tmp_path / "t.db", trials=True)
    header = dest.read_bytes()[:100]
    assert header[18:20] == b"\x01\x01"  # rollback journal (2 would be WAL)
    raw = sqlite3.connect(dest)
    assert raw.execute("PRAGMA freelist_count").fetchone() == (0,)  # VACUUMed
    raw.close()
    with TuningDB(dest, read_only=True, immutable=True, source="user") as shipped:
        assert shipped.schema_version == SCHEMA_VERSION
        assert shipped.winners() == winners
        assert shipped.devices() == devices
        assert shipped.trials() == []
    with TuningDB(with_trials, read_only=True) as copy:
        assert len(copy.trials()) == 50
    # Nothing left beside them: no half-built file, no journal of the copies (user.db.lock is
    # the lock file of the writable source, which every writable open holds shared).
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.db", "t.db", "user.db",
                                                          "user.db.lock"]
