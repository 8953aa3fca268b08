"""The shipped tuning database serves the kernels that were timed, rendered by today's code.

Winners are keyed by what runs: each records the digest of its kernel's code
(:func:`autonorm.codegen.environment.kernel_digest`), and lookup uses one only while its
configuration still renders that kernel. These CPU tests render every shipped winner and compare
it with the digest stored beside it and with the kernels the shipped winners were tuned on
(``fixtures/shipped_kernels.json``: names and digests as the autonorm that tuned them rendered
them), so a change to the code that alters a tuned kernel fails here, not silently on an H200.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from autonorm import lookup, settings
from autonorm.ops import registry
from autonorm.runtime.device import DeviceInfo
from autonorm.store.db import SCHEMA_VERSION, TuningDB, TuningKey

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "shipped_kernels.json"
SHIPPED = Path(__file__).resolve().parent.parent / "tuning_db" / "autonorm.db"

H200 = DeviceInfo("NVIDIA H200", 90, 132, 62914560, 232448, 6016, 3201000)

EXPECTED = {
    TuningKey(w["device"], w["op"], w["problem"], w["rows_bucket"]): w
    for w in json.loads(FIXTURE.read_text())["winners"]
}


@pytest.fixture(scope="module")
def shipped():
    with TuningDB(SHIPPED, read_only=True, immutable=True, source="shipped") as db:
        yield db


def _render(db: TuningDB, winner):  # noqa: ANN001, ANN202
    family = registry.get(winner.key.op)
    problem = family.problem(**winner.key.fields)
    config = family.config_from_dict(winner.config)
    limits = db.device_limits(winner.key.device)
    assert limits is not None, f"device {winner.key.device} is not recorded"
    return problem, config, family.render(config, problem, limits)


def test_the_shipped_db_holds_the_tuned_winners(shipped: TuningDB) -> None:
    assert shipped.schema_version == SCHEMA_VERSION
    winners = shipped.winners()
    assert len(winners) == len(EXPECTED) == 45
    assert {w.key for w in winners} == set(EXPECTED)
    assert all(w.kernel is not None for w in winners)
    assert [d["fingerprint"] for d in shipped.devices()] == [H200.fingerprint]
    assert shipped.device_limits(H200.fingerprint) == H200.limits()


@pytest.mark.parametrize("key", sorted(EXPECTED, key=lambda k: (k.problem, k.rows_bucket)),
                         ids=lambda k: f"{k.dtype}-{k.hidden}-r{k.rows_bucket}")
def test_every_shipped_winner_renders_the_kernel_that_was_timed(
    shipped: TuningDB, key: TuningKey
) -> None:
    from autonorm.codegen.environment import kernel_digest

    winner = shipped.get_winner(key)
    expected = EXPECTED[key]
    problem, config, kernel = _render(shipped, winner)
    assert config.label() == expected["label"]
    assert kernel_digest(kernel.source) == winner.kernel  # the digest stored with the winner
    assert kernel_digest(kernel.source) == expected["code"]  # the kernel it was tuned on
    assert kernel.name == expected["name"]
    status, _ = lookup.verdict(winner, problem, shipped.device_limits(key.device))
    assert status == lookup.USABLE


def test_a_winner_whose_kernel_changed_is_skipped(shipped: TuningDB, tmp_path: Path) -> None:
    # Copy one shipped winner into a user DB, as if timed on a kernel its config no longer
    # renders (the same digest but one character): lookup must pass over it.
    winner = shipped.get_winner(next(iter(EXPECTED)))
    problem, config, _ = _render(shipped, winner)
    device = lookup.Device(H200.fingerprint, H200.limits())
    changed = winner.kernel[:-1] + ("0" if winner.kernel[-1] != "0" else "1")
    with TuningDB(tmp_path / "user.db") as user:
        user.record_device(H200)
        user.set_winner(winner.key, winner.config, winner.metrics, changed)
        stale = user.get_winner(winner.key)
        assert lookup.verdict(stale, problem, H200.limits())[0] == lookup.STALE
        rows = winner.key.rows_bucket
        alone = lookup.choose(problem, rows, device, [user])
        assert alone.source == "default"
        both = lookup.choose(problem, rows, device, [user, shipped])
        assert (both.source, both.config, both.winner.kernel) == ("shipped", config,
                                                                  winner.kernel)
        user.set_winner(winner.key, winner.config, winner.metrics, winner.kernel)
        assert lookup.choose(problem, rows, device, [user, shipped]).source == "user"


def test_opening_the_shipped_db_leaves_no_files_beside_it(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.delenv("AUTONORM_SHIPPED_DB", raising=False)
    monkeypatch.delenv("AUTONORM_NO_SHIPPED_DB", raising=False)
    assert settings.shipped_db_path().resolve() == SHIPPED.resolve()
    before = sorted(p.name for p in SHIPPED.parent.iterdir())
    assert not [name for name in before if name.startswith("autonorm.db-")]
    with TuningDB.open_shipped() as db:
        assert len(db.winners()) == 45
        assert sorted(p.name for p in SHIPPED.parent.iterdir()) == before
    assert sorted(p.name for p in SHIPPED.parent.iterdir()) == before


def test_the_shipped_db_is_one_compact_file() -> None:
    header = SHIPPED.read_bytes()[:100]
    assert header[18:20] == b"\x01\x01"  # rollback journal: no WAL file to ship beside it
    conn = sqlite3.connect(f"{SHIPPED.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
    try:
        assert conn.execute("PRAGMA freelist_count").fetchone() == (0,)  # VACUUMed
        assert conn.execute("SELECT count(*) FROM trials").fetchone() == (0,)
    finally:
        conn.close()
