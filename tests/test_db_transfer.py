"""Winners that travel: ``autonorm db export``, ``import`` and ``check`` (CPU, real SQLite).

An export imported into an empty database gives the same dispatch choices; a tampered file, a
file of an unknown format version and an entry of another kernel version are refused with one
clear line; an import keeps the faster winner per key and loses nothing already stored; ``db
check`` finds a corrupted winner and a corrupted file. The GPU path of ``--verify`` carries the
``gpu`` marker.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from autonorm import cli, lookup
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.rules import check as rules_check
from autonorm.runtime.device import DeviceInfo, NoGPUError
from autonorm.store import audit, bundle, transfer
from autonorm.store.db import TuningDB, TuningKey

H200 = DeviceInfo(name="NVIDIA H200", cc=90, sm_count=132, l2_bytes=62914560,
                  smem_optin=232448, mem_bus_bits=6016, mem_clock_khz=3201000)
A100 = DeviceInfo(name="NVIDIA A100-SXM4-80GB", cc=80, sm_count=108, l2_bytes=41943040,
                  smem_optin=166912, mem_bus_bits=5120, mem_clock_khz=1593000,
                  smem_per_sm=167936)

ROW = KernelConfig(256, 8, 1, "smem", "two_pass", 1, 0)
ROW2 = KernelConfig(256, 8, 2, "smem", "two_pass", 1, 0)
ROW128 = KernelConfig(128, 8, 1, "smem", "two_pass", 1, 0)
ROW_FP32 = KernelConfig(128, 4, 1, "smem", "two_pass", 1, 0)

BF16_4096 = Problem(4096, "bfloat16")
BF16_8192 = Problem(8192, "bfloat16")
FP32_4096 = Problem(4096, "float32")


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A tmp user DB (``user.db``), no shipped DB, a fake H200 as this machine's GPU."""
    import autonorm.runtime.device

    monkeypatch.setenv("AUTONORM_DB", str(tmp_path / "user.db"))
    monkeypatch.setenv("AUTONORM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("AUTONORM_NO_SHIPPED_DB", "1")
    monkeypatch.delenv("AUTONORM_SHIPPED_DB", raising=False)
    monkeypatch.setattr(autonorm.runtime.device, "query_device", lambda device_id=None: H200)
    return tmp_path


def put(db: TuningDB, info: DeviceInfo, problem: Problem, config: KernelConfig, bucket: int,
        median_us: float = 10.0, kernel: str | None = None) -> TuningKey:
    """Store ``config`` as ``info``'s winner of ``problem`` (the digest of its kernel there)."""
    limits = info.limits()
    assert rules_check(config, problem, limits) == [], config.label()
    db.record_device(info)
    key = TuningKey.for_problem(info.fingerprint, problem, bucket)
    db.set_winner(key, config.to_dict(), {"median_us": median_us, "rows": bucket},
                  kernel or lookup.kernel_of(config, problem, limits))
    return key


def invoke(args: list[str]) -> tuple[int, str, str]:
    """Run the CLI as the console script does; return (status, stdout, stderr)."""
    result = CliRunner().invoke(cli.main, args)
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        result.exc_info)
    assert "Traceback" not in result.stdout + result.stderr
    return result.exit_code, result.stdout, result.stderr


def one_error(status: int, stderr: str) -> str:
    """The single ``error:`` line of a failed command."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert status != 0 and len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


def last_line(stderr: str) -> str:
    return ([line for line in stderr.splitlines() if line.strip()] or ["(no message)"])[-1]


def fill(db: TuningDB) -> None:
    """Winners of two GPU kinds, several shapes and buckets."""
    put(db, H200, BF16_4096, ROW, 4096, 9.0)
    put(db, H200, BF16_4096, ROW2, 1 << 14, 30.0)
    put(db, H200, BF16_8192, ROW, 8192, 20.0)
    put(db, H200, FP32_4096, ROW_FP32, 4096, 15.0)
    put(db, A100, BF16_4096, ROW128, 4096, 14.0)


def export_to(env: Path, db_name: str, out: Path, *extra: str) -> None:
    """``autonorm db export`` of the database ``db_name`` in ``env`` into ``out``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AUTONORM_DB", str(env / db_name))
        status, _, stderr = invoke(["db", "export", "-o", str(out), *extra])
    assert status == 0, stderr
    assert last_line(stderr).startswith("exported "), stderr


def choices(db: TuningDB) -> list[lookup.Choice]:
    found = []
    for info in (H200, A100):
        device = lookup.Device(info.fingerprint, info.limits())
        for problem in (BF16_4096, BF16_8192, FP32_4096, Problem(5000, "bfloat16")):
            for rows in (None, 1, 100, 4096, 5000, 1 << 14, 1 << 20):
                found.append(lookup.choose(problem, rows, device, [db]))
    return found


def test_an_export_imported_into_an_empty_database_dispatches_the_same(env: Path) -> None:
    with TuningDB(env / "source.db") as source:
        fill(source)
    export_to(env, "source.db", env / "winners.json")
    status, stdout, stderr = invoke(["db", "import", str(env / "winners.json")])
    assert status == 0, stderr
    assert last_line(stderr).startswith("5 added, 0 replaced, 0 kept, 0 unchanged from ")
    assert stdout.count("add ") == 5
    with TuningDB(env / "source.db") as source, TuningDB(env / "user.db") as user:
        before, after = choices(source), choices(user)
        assert after == before
        assert sum(c.source == "user" for c in after) >= 6  # the winners, not the defaults
        # The other GPU's limits travelled with its winners.
        assert user.device_limits(A100.fingerprint) == A100.limits()
        assert [w.tuned_at for w in user.winners()] == [w.tuned_at for w in source.winners()]


def test_another_database_imports_like_a_file(env: Path) -> None:
    with TuningDB(env / "other.db") as other:
        fill(other)
    status, _, stderr = invoke(["db", "import", str(env / "other.db")])
    assert status == 0, stderr
    with TuningDB(env / "other.db") as other, TuningDB(env / "user.db") as user:
        assert choices(user) == choices(other)


def test_the_file_carries_what_is_needed_to_trust_it(env: Path) -> None:
    with TuningDB(env / "user.db") as db:
        key = put(db, H200, BF16_4096, ROW, 4096)
        db.record_trial(key, ROW.to_dict(), "ok", metrics={"median_us": 10.0,
                                                           "max_rel_err": 1.5e-3})
    export_to(env, "user.db", env / "winners.json")
    document = json.loads((env / "winners.json").read_text())
    assert document["format"] == bundle.FORMAT and document["format_version"] == 1
    assert document["sha256"] == bundle.seal(document)
    [entry] = document["winners"]
    assert entry["device"] == H200.fingerprint and entry["device_name"] == "NVIDIA H200"
    assert entry["kernel"] == lookup.kernel_of(ROW, BF16_4096, H200.limits())
    assert entry["verification"]["max_rel_err"] == 1.5e-3
    assert entry["problem"] == {"dtype": "bfloat16", "has_bias": True, "has_weight": True,
                                "hidden": 4096}
    assert document["devices"][0]["sm_count"] == 132


def test_the_export_filters(env: Path) -> None:
    with TuningDB(env / "user.db") as db:
        fill(db)
    out = env / "some.json"
    export_to(env, "user.db", out, "--dtype", "fp32")
    assert [w["problem"]["dtype"] for w in json.loads(out.read_text())["winners"]] == ["float32"]
    export_to(env, "user.db", out, "--device", "a100")
    assert {w["device"] for w in json.loads(out.read_text())["winners"]} == {A100.fingerprint}
    export_to(env, "user.db", out, "--hidden", "8192")
    assert len(json.loads(out.read_text())["winners"]) == 1
    status, _, stderr = invoke(["db", "export", "-o", str(out), "--hidden", "123"])
    assert "no winners in" in one_error(status, stderr)


def _sealed_file(env: Path, change=None, reseal: bool = True) -> Path:  # noqa: ANN001
    with TuningDB(env / "source.db") as source:
        put(source, H200, BF16_4096, ROW, 4096)
        put(source, H200, BF16_8192, ROW, 8192)
    export_to(env, "source.db", env / "winners.json")
    document = json.loads((env / "winners.json").read_text())
    if change is not None:
        change(document)
        if reseal:
            document["sha256"] = bundle.seal(document)
    (env / "winners.json").write_text(bundle.dump(document))
    return env / "winners.json"


def _user_winners(env: Path) -> list:
    if not (env / "user.db").exists():
        return []
    with TuningDB(env / "user.db") as db:
        return db.winners()


def test_a_tampered_file_is_refused_whole(env: Path) -> None:
    path = _sealed_file(env, lambda doc: doc["winners"][0]["metrics"].update(median_us=0.1),
                        reseal=False)
    status, _, stderr = invoke(["db", "import", str(path)])
    assert "has been modified since it was exported" in one_error(status, stderr)
    assert _user_winners(env) == []


def test_a_file_of_an_unknown_format_version_is_refused(env: Path) -> None:
    path = _sealed_file(env, lambda doc: doc.update(format_version=2))
    status, _, stderr = invoke(["db", "import", str(path)])
    assert "format version 2; this autonorm reads version 1" in one_error(status, stderr)
    assert _user_winners(env) == []


def test_a_file_that_is_not_a_winners_file_is_refused(env: Path) -> None:
    (env / "x.json").write_text('{"hello": 1}')
    status, _, stderr = invoke(["db", "import", str(env / "x.json")])
    assert "is not an autonorm winners file" in one_error(status, stderr)
    (env / "y.json").write_text("{")
    status, _, stderr = invoke(["db", "import", str(env / "y.json")])
    assert "neither a winners file (JSON) nor an autonorm database" in one_error(status, stderr)


def test_entries_of_another_kernel_version_are_refused_and_counted(env: Path) -> None:
    def foreign(document: dict) -> None:
        document["winners"][0]["kernel"] = "0" * 64  # what another version rendered

    path = _sealed_file(env, foreign)
    status, stdout, stderr = invoke(["db", "import", str(path)])
    assert status == 0, stderr
    assert last_line(stderr).endswith("refused 1 (1 another kernel version)"), stderr
    assert "another kernel version" in stdout and "refuse" in stdout
    assert [w.key.hidden for w in _user_winners(env)] == [8192]

    def all_foreign(document: dict) -> None:
        for entry in document["winners"]:
            entry["kernel"] = "0" * 64

    (env / "user.db").unlink()
    status, _, stderr = invoke(["db", "import", str(_sealed_file(env, all_foreign))])
    line = one_error(status, stderr)
    assert "nothing imported" in line and "refused 2 (2 another kernel version)" in line
    assert _user_winners(env) == []


def test_an_entry_the_rules_refuse_on_its_gpu_is_refused(env: Path) -> None:
    path = _sealed_file(env, lambda doc: doc["winners"][0]["config"].update(threads=7))
    status, _, stderr = invoke(["db", "import", str(path)])
    assert status == 0 and "refused 1 (1 " in last_line(stderr), stderr


def test_the_faster_winner_stays_and_nothing_is_lost(env: Path) -> None:
    with TuningDB(env / "user.db") as user:
        fast = put(user, H200, BF16_4096, ROW128, 4096, median_us=5.0)   # faster than the file
        slow = put(user, H200, BF16_8192, ROW2, 8192, median_us=50.0)    # slower than the file
        own = put(user, H200, FP32_4096, ROW_FP32, 4096, median_us=7.0)    # not in the file
    path = _sealed_file(env)  # both at 10 us
    status, stdout, stderr = invoke(["db", "import", "--dry-run", str(path)])
    assert status == 0, stderr
    assert last_line(stderr).startswith("dry run, nothing written: would have 0 added, "
                                        "1 replaced, 1 kept")
    with TuningDB(env / "user.db") as user:
        assert user.get_winner(slow).config == ROW2.to_dict()  # the dry run wrote nothing
        assert user.trials() == []
    status, stdout, stderr = invoke(["db", "import", str(path)])
    assert status == 0, stderr
    assert last_line(stderr).startswith("0 added, 1 replaced, 1 kept, 0 unchanged")
    with TuningDB(env / "user.db") as user:
        assert user.get_winner(fast).config == ROW128.to_dict()
        assert user.get_winner(fast).metrics["median_us"] == 5.0
        assert user.get_winner(slow).config == ROW.to_dict()
        assert user.get_winner(own).config == ROW_FP32.to_dict()
        # The replaced winner stays in the trials table, with its configuration and timing.
        kept = [t for t in user.trials(slow) if t["study"] == transfer.REPLACED_STUDY]
        assert [(t["config"], t["median_us"]) for t in kept] == [(ROW2.to_dict(), 50.0)]
    status, _, stderr = invoke(["db", "import", str(path)])
    assert last_line(stderr).startswith("0 added, 0 replaced, 1 kept, 1 unchanged"), stderr


def test_a_stale_winner_is_replaced_by_a_current_one(env: Path) -> None:
    with TuningDB(env / "user.db") as user:
        key = put(user, H200, BF16_4096, ROW128, 4096, median_us=1.0, kernel="f" * 64)
    status, _, stderr = invoke(["db", "import", str(_sealed_file(env))])
    assert status == 0 and "1 replaced" in last_line(stderr), stderr
    with TuningDB(env / "user.db") as user:
        assert user.get_winner(key).config == ROW.to_dict()


def test_a_verifier_that_fails_refuses_the_entry(env: Path) -> None:
    def verifier(winner, problem, config):  # noqa: ANN001, ANN202
        ok = problem.hidden == 4096
        return audit.Reverified(ok, "ok" if ok else "verification: row 3 differs", 2e-3)

    path = _sealed_file(env)
    with TuningDB(env / "user.db") as user:
        report = transfer.merge(user, bundle.load(path), verifier=verifier)
        assert report.refusals() == {"failed verification": 1}
        assert [w.key.hidden for w in report.added] == [4096]
        [trial] = user.trials()
        assert trial["study"] == transfer.IMPORTED_STUDY and trial["max_rel_err"] == 2e-3


def test_verify_without_a_gpu_says_so(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import autonorm.runtime.device

    def no_gpu(device_id: int | None = None) -> DeviceInfo:
        raise NoGPUError("no CUDA GPU found on this machine")

    monkeypatch.setattr(autonorm.runtime.device, "query_device", no_gpu)
    path = _sealed_file(env)
    for args in (["db", "import", "--verify", str(path)], ["db", "check", "--verify"]):
        status, _, stderr = invoke(args)
        assert "--verify needs a CUDA GPU" in one_error(status, stderr)
    assert _user_winners(env) == []


def test_check_passes_a_sound_database_and_names_stale_winners(env: Path) -> None:
    status, _, stderr = invoke(["db", "check"])
    assert status == 0 and "nothing to check" in last_line(stderr)
    with TuningDB(env / "user.db") as db:
        fill(db)
        put(db, H200, Problem(2048, "bfloat16"), ROW, 4096, kernel="e" * 64)
    status, stdout, stderr = invoke(["db", "check"])
    assert status == 0, stderr
    assert last_line(stderr).endswith("integrity ok; 6 winners: 1 stale, 5 usable")
    assert "another kernel version" in stdout


def test_check_finds_a_corrupted_winner(env: Path) -> None:
    with TuningDB(env / "user.db") as db:
        fill(db)
    with sqlite3.connect(env / "user.db") as conn:
        conn.execute("UPDATE winners SET config = '{\"threads\": 256, \"v' WHERE hidden = 8192")
        conn.execute("UPDATE winners SET config = '{\"threads\": 7}' WHERE dtype = 'float32'")
    conn.close()
    status, stdout, stderr = invoke(["db", "check"])
    line = one_error(status, stderr)
    assert "integrity ok; 5 winners: 1 corrupt, 1 invalid, 3 usable" in line, line
    assert "unreadable row" in stdout and "threads must be one of" in stdout
    # An export refuses to carry it; an import of the database refuses it and counts it.
    status, _, stderr = invoke(["db", "export", "-o", str(env / "w.json")])
    assert "see `autonorm db check`" in one_error(status, stderr)
    (env / "user.db").rename(env / "damaged.db")
    status, _, stderr = invoke(["db", "import", str(env / "damaged.db")])
    assert status == 0 and "refused 2 (" in last_line(stderr), stderr
    assert len(_user_winners(env)) == 3


def test_check_finds_a_corrupted_file_and_leaves_it_alone(env: Path) -> None:
    garbage = b"this is not an SQLite database\n" * 100
    (env / "user.db").write_bytes(garbage)
    status, _, stderr = invoke(["db", "check"])
    assert "is corrupt: the integrity check found: file is not a database" in one_error(
        status, stderr)
    assert (env / "user.db").read_bytes() == garbage  # evidence kept for the user


def test_check_finds_damaged_pages(env: Path) -> None:
    with TuningDB(env / "user.db") as db:
        for hidden in range(1024, 1024 + 64 * 200, 64):
            put(db, H200, Problem(hidden, "float32"), ROW_FP32, 4096)
    conn = sqlite3.connect(env / "user.db")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("PRAGMA journal_mode=DELETE")
    conn.close()
    data = bytearray((env / "user.db").read_bytes())
    page = 4096
    for offset in range(3 * page + 8, len(data) - page, 7 * page):
        data[offset:offset + 64] = b"\xff" * 64  # scribble over b-tree page headers
    (env / "user.db").write_bytes(bytes(data))
    status, _, stderr = invoke(["db", "check"])
    assert "is corrupt" in one_error(status, stderr)


@pytest.mark.gpu
def test_import_and_check_verify_on_the_gpu(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """This GPU's default kernel, exported, imported with --verify, then checked with it."""
    from autonorm.ops.layer_norm.heuristic import default_config
    from autonorm.runtime.device import query_device

    monkeypatch.setenv("AUTONORM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("AUTONORM_NO_SHIPPED_DB", "1")
    info = query_device()
    config = default_config(BF16_4096, info.limits(), 4096)
    with TuningDB(tmp_path / "source.db") as source:
        put(source, info, BF16_4096, config, 4096)
        put(source, A100 if info.cc != 80 else H200, BF16_4096, ROW128, 4096)
    monkeypatch.setenv("AUTONORM_DB", str(tmp_path / "source.db"))
    status, _, stderr = invoke(["db", "export", "-o", str(tmp_path / "w.json")])
    assert status == 0, stderr
    monkeypatch.setenv("AUTONORM_DB", str(tmp_path / "user.db"))
    status, stdout, stderr = invoke(["db", "import", "--verify", str(tmp_path / "w.json")])
    assert status == 0, stderr
    assert "1 added" in last_line(stderr) and "1 failed verification" in last_line(stderr)
    assert "not on this GPU" in stdout
    status, stdout, stderr = invoke(["db", "check", "--verify"])
    assert status == 0, stderr
    assert "verified again on" in stdout
