"""Stress test: several processes open one freshly corrupted tuning database at the same moment.

Each round writes a corrupt file (garbage, or a database cut short), then every worker opens it
at once (a barrier), records trials and reports how many ``record_trial`` calls returned. The
file left behind must hold every acknowledged row, no worker may fail, and each round's corrupt
file must be kept aside, byte for byte, under a name of its own.

CI runs ``AUTONORM_TEST_STRESS_ROUNDS`` (default 100: a few seconds) rounds of
``AUTONORM_TEST_STRESS_WORKERS`` (default 4) workers; for a long run by hand::

    AUTONORM_TEST_STRESS_ROUNDS=500 python -m pytest -q -s tests/test_db_concurrency.py

Nothing here depends on timing: the barriers only synchronize (their timeouts catch a hang).
"""

from __future__ import annotations

import contextlib
import errno
import multiprocessing
import os
import re
import sqlite3
import warnings
from pathlib import Path

import pytest

from autonorm.errors import CorruptDatabaseWarning
from autonorm.ops.base import problem_key
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.problem import Problem
from autonorm.store import connection, recovery
from autonorm.store.db import TuningDB, TuningKey

ROUNDS = int(os.environ.get("AUTONORM_TEST_STRESS_ROUNDS", "100"))
WORKERS = int(os.environ.get("AUTONORM_TEST_STRESS_WORKERS", "4"))
TRIALS = 8  # per worker and round
HANG_S = 300  # a barrier not passed in this long means a worker hangs
KEY = TuningKey("gpu", "layer_norm", problem_key(Problem(1024, "bfloat16")), 64)


def corrupt_bytes(round_: int, whole_db: bytes) -> bytes:
    """The corrupt file of a round: garbage, or a database cut short (both unique per round)."""
    marker = f"round {round_}\n".encode()
    if round_ % 2:
        return marker + b"this is not an SQLite database\n" * 150
    return whole_db[:3000] + marker


def _worker(path: str, worker: int, rounds: int, start, done, results) -> None:  # noqa: ANN001
    """Run in a child process: each round, open the corrupt file with the others and write."""
    config = KernelConfig().to_dict()
    for round_ in range(rounds):
        start.wait(timeout=HANG_S)
        acknowledged, error = 0, None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", CorruptDatabaseWarning)
                with TuningDB(path) as db:
                    for i in range(TRIALS):
                        db.record_trial(KEY, config, "ok", study=f"round-{round_}",
                                        trial_number=worker * 1000 + i)
                        acknowledged += 1
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which fails the test
            error = f"{type(exc).__name__}: {exc}"
        results.put((round_, worker, acknowledged, error))
        done.wait(timeout=HANG_S)


def _stored(path: Path, round_: int) -> dict[int, int]:
    """Rows of each worker that the database at ``path`` holds for a round."""
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT trial_number / 1000, COUNT(*) FROM trials WHERE study = ? GROUP BY 1",
            [f"round-{round_}"],
        ).fetchall()
    finally:
        conn.close()
    return dict(rows)


def _whole_db(tmp_path: Path) -> bytes:
    """A sound database file of a few pages, to cut short."""
    path = tmp_path / "whole.db"
    with TuningDB(path) as db:
        for i in range(100):
            db.record_trial(KEY, KernelConfig().to_dict(), "compile", error=f"{i}" * 300)
    data = path.read_bytes()
    path.unlink()
    assert len(data) > 3 * 3000
    return data


def test_concurrent_recovery_of_a_corrupt_db_loses_no_acknowledged_row(tmp_path: Path) -> None:
    whole = _whole_db(tmp_path)
    folder = tmp_path / "cache"
    folder.mkdir()
    path = folder / "user.db"
    ctx = multiprocessing.get_context("spawn")
    start, done = ctx.Barrier(WORKERS + 1), ctx.Barrier(WORKERS + 1)
    results = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(str(path), w, ROUNDS, start, done, results))
             for w in range(WORKERS)]
    for proc in procs:
        proc.start()
    acknowledged = stored = 0
    lost: list[str] = []
    errors: list[str] = []
    corrupt: dict[bytes, int] = {}
    try:
        for round_ in range(ROUNDS):
            for suffix in ("", "-wal", "-shm", "-journal"):
                path.with_name(path.name + suffix).unlink(missing_ok=True)
            data = corrupt_bytes(round_, whole)
            path.write_bytes(data)
            corrupt[data] = round_
            start.wait(timeout=HANG_S)
            done.wait(timeout=HANG_S)
            reports = [results.get(timeout=HANG_S) for _ in range(WORKERS)]
            rows = _stored(path, round_)
            for _, worker, acked, error in reports:
                acknowledged += acked
                stored += rows.get(worker, 0)
                if error:
                    errors.append(f"round {round_} worker {worker}: {error}")
                if rows.get(worker, 0) != acked:
                    lost.append(f"round {round_} worker {worker}: {acked} acknowledged, "
                                f"{rows.get(worker, 0)} stored")
    finally:
        for proc in procs:
            proc.join(timeout=HANG_S)
            if proc.is_alive():
                proc.terminate()

    aside = re.compile(re.escape(path.name) + r"\.corrupt-\d{8}T\d{6}Z(-\d+)?")
    kept = sorted(corrupt.get(p.read_bytes(), -1) for p in folder.iterdir()
                  if aside.fullmatch(p.name))
    print(f"\n{ROUNDS} rounds x {WORKERS} workers: {acknowledged} rows acknowledged, "
          f"{stored} stored, {len(lost)} rounds lost rows, {len(errors)} errors, "
          f"{len(kept)} corrupt files kept aside")
    assert errors == []
    assert lost == []
    assert stored == acknowledged == ROUNDS * WORKERS * TRIALS
    assert [proc.exitcode for proc in procs] == [0] * WORKERS
    # Every round's corrupt file is kept, once, byte for byte: none overwrote another.
    assert kept == list(range(ROUNDS))


@pytest.mark.parametrize("round_", [0, 1])
def test_each_kind_of_corrupt_file_is_seen_as_corrupt(tmp_path: Path, round_: int) -> None:
    path = tmp_path / "user.db"
    path.write_bytes(corrupt_bytes(round_, _whole_db(tmp_path)))
    with pytest.warns(CorruptDatabaseWarning):
        TuningDB(path).close()


# -- the protocol, step by step (deterministic) ----------------------------------------------

STAMP = "20260101T000000Z"


def test_a_file_another_process_replaced_meanwhile_is_used_not_set_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interleaving that lost rows: found corrupt, but fresh by the time the lock is held."""
    path, fresh = tmp_path / "user.db", tmp_path / "fresh.db"
    path.write_bytes(corrupt_bytes(1, b""))
    with TuningDB(fresh) as other:
        other.record_trial(KEY, KernelConfig().to_dict(), "ok", study="other")
    real_locked = recovery.locked

    @contextlib.contextmanager
    def locked(db_path: Path, *, exclusive: bool):  # noqa: ANN202
        with real_locked(db_path, exclusive=exclusive):
            if exclusive and fresh.exists():
                # Another process held the lock first: it set the corrupt file aside, started
                # a fresh one and wrote a trial to it.
                path.rename(tmp_path / "other.aside")
                fresh.rename(path)
            yield

    monkeypatch.setattr(recovery, "locked", locked)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CorruptDatabaseWarning)  # this process sets nothing aside
        with TuningDB(path) as db:
            assert [t["study"] for t in db.trials()] == ["other"]
            db.record_trial(KEY, KernelConfig().to_dict(), "ok", study="this")
    with TuningDB(path) as db:
        assert [t["study"] for t in db.trials()] == ["other", "this"]
    assert not [p for p in tmp_path.iterdir() if ".corrupt-" in p.name]
    assert (tmp_path / "other.aside").read_bytes() == corrupt_bytes(1, b"")


@pytest.mark.parametrize("taken", ["", "-wal", "-2"])
def test_a_name_in_use_is_never_reused_for_evidence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, taken: str
) -> None:
    monkeypatch.setattr(recovery, "utc_stamp", lambda: STAMP)
    path = tmp_path / "user.db"
    earlier = tmp_path / f"user.db.corrupt-{STAMP}{taken}"
    earlier.write_bytes(b"earlier evidence")
    path.write_bytes(corrupt_bytes(1, b""))
    path.with_name("user.db-wal").write_bytes(b"its wal")
    with pytest.warns(CorruptDatabaseWarning) as record:
        TuningDB(path).close()
    expected = tmp_path / f"user.db.corrupt-{STAMP}" if taken == "-2" else tmp_path / (
        f"user.db.corrupt-{STAMP}-2")
    assert str(expected) in str(record[0].message)
    assert expected.read_bytes() == corrupt_bytes(1, b"")
    assert earlier.read_bytes() == b"earlier evidence"
    # SQLite itself may delete a -wal it finds invalid; one that is left moves aside with its
    # database, never to be paired with the fresh file.
    wal = path.with_name("user.db-wal")
    assert not wal.exists() or wal.read_bytes() != b"its wal"
    wal_aside = expected.with_name(expected.name + "-wal")
    assert not wal_aside.exists() or wal_aside.read_bytes() == b"its wal"


def test_without_hard_links_a_file_is_renamed_but_never_over_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_links(*args: object) -> None:
        raise PermissionError(errno.EPERM, "hard links are not supported here")

    monkeypatch.setattr(os, "link", no_links)
    source, dest = tmp_path / "a", tmp_path / "b"
    source.write_bytes(b"a")
    dest.write_bytes(b"b")
    assert not recovery._move_new(source, dest)
    assert (source.read_bytes(), dest.read_bytes()) == (b"a", b"b")
    dest.unlink()
    assert recovery._move_new(source, dest)
    assert not source.exists() and dest.read_bytes() == b"a"


def test_a_writable_open_waits_for_the_exclusive_lock(tmp_path: Path) -> None:
    """While one process replaces a corrupt file (exclusive lock), no other one opens it."""
    path = tmp_path / "user.db"
    TuningDB(path).close()
    ctx = multiprocessing.get_context("spawn")
    opened = ctx.Event()
    with recovery.locked(path, exclusive=True):
        child = ctx.Process(target=_open_and_signal, args=(str(path), opened))
        child.start()
        # The child cannot open the file while the lock is held here: it has not signalled.
        # (Waiting a little proves nothing either way under load; only the order matters.)
        assert not opened.wait(timeout=1.0)
    child.join(timeout=HANG_S)
    assert child.exitcode == 0
    assert opened.is_set()


def _open_and_signal(path: str, opened) -> None:  # noqa: ANN001
    with TuningDB(path):
        opened.set()


def test_a_file_missing_for_a_moment_is_not_taken_for_read_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process sets a corrupt file aside: it is gone at one look, fresh at the next."""
    path = tmp_path / "user.db"
    TuningDB(path).close()
    real_access, looks = os.access, []

    def access(target: object, mode: int, **kwargs: object) -> bool:
        if Path(str(target)) == path and mode == os.W_OK and not looks:
            looks.append(target)
            return False  # the moment between the rename and the fresh file
        return real_access(target, mode, **kwargs)

    monkeypatch.setattr(os, "access", access)
    assert connection.read_only_reason(path) is None
    assert looks == [path]
