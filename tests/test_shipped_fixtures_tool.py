"""``tools/shipped_fixtures.py``: the shipped database's test fixtures follow its winners.

The fixtures are up to date with the shipped database; on a copy with one winner gone and one
replaced by another configuration, the tool drops the one, records the other as today's code
renders it and counts them in ``about``; a winner tuned again in the same configuration (as
after a change to its kernel's code) is recorded anew, one kept keeps the code it was tuned on;
a winner whose configuration no longer renders the kernel that was timed stops it.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from autonorm.codegen.environment import code_of, kernel_digest
from autonorm.ops import registry
from autonorm.store.db import TuningDB

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("shipped_fixtures",
                                              ROOT / "tools" / "shipped_fixtures.py")
tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tool)


def _fixtures() -> tuple[dict, dict]:
    return (json.loads(tool.FIXTURE.read_text()),
            json.loads(gzip.decompress(tool.CODE_BEFORE.read_bytes())))


def test_the_fixtures_follow_the_shipped_db() -> None:
    assert tool.main(["--check"]) == 0


def test_a_dropped_and_a_replaced_winner_are_recorded(tmp_path: Path) -> None:
    db_path = tmp_path / "autonorm.db"
    shutil.copy(tool.SHIPPED, db_path)
    fixture, code = _fixtures()
    gone, changed = fixture["winners"][0], fixture["winners"][-1]
    with sqlite3.connect(db_path) as conn:
        conn.execute("DELETE FROM winners WHERE op = ? AND problem = ? AND rows_bucket = ?",
                     (gone["op"], gone["problem"], gone["rows_bucket"]))
    with TuningDB(db_path) as db:
        winner = next(w for w in db.winners() if (w.key.op, w.key.problem, w.key.rows_bucket)
                      == (changed["op"], changed["problem"], changed["rows_bucket"]))
        family = registry.get(winner.key.op)
        problem = family.problem(**winner.key.fields)
        limits = db.device_limits(winner.key.device)
        other = next(c for c in family.space(problem, limits)
                     if c.label() != changed["label"])
        kernel = family.render(other, problem, limits)
        db.set_winner(winner.key, other.to_dict(), winner.metrics, kernel_digest(kernel.source))
    fresh, fresh_code, changes = tool.refresh(db_path, fixture, dict(code))
    assert sorted(line.split(":")[0] for line in changes) == ["dropped", "replaced"]
    assert len(fresh["winners"]) == len(fixture["winners"]) - 1
    assert f"The {len(fresh['winners'])} winners" in fresh["about"]
    entry = next(e for e in fresh["winners"] if e["label"] == other.label())
    assert (entry["name"], entry["code"]) == (kernel.name, kernel_digest(kernel.source))
    assert fresh_code[kernel.name] == code_of(kernel.source)
    assert gone["name"] not in fresh_code or gone["name"] in {e["name"] for e in fresh["winners"]}
    # Stored with the digest of a kernel its configuration does not render: refused.
    with TuningDB(db_path) as db:
        db.set_winner(winner.key, other.to_dict(), winner.metrics, "0" * 64)
    with pytest.raises(SystemExit, match="no longer renders the kernel that was timed"):
        tool.refresh(db_path, fixture, dict(code))


def test_a_winner_tuned_again_in_the_same_configuration_is_recorded_anew(tmp_path: Path) -> None:
    # After a change to a kernel's code the winner is tuned again, often to the same
    # configuration: its fixture must then hold the code it was tuned on now, or the machine
    # code check compares today's kernel with the one of before. The fixture's own code, as
    # recorded, stands in for "before" here; the new time tells the tool it was tuned again.
    db_path = tmp_path / "autonorm.db"
    shutil.copy(tool.SHIPPED, db_path)
    fixture, code = _fixtures()
    entry = fixture["winners"][0]
    code[entry["name"]] = "// the code it was tuned on before\n" + code[entry["name"]]
    with TuningDB(db_path) as db:
        winner = next(w for w in db.winners() if (w.key.op, w.key.problem, w.key.rows_bucket)
                      == (entry["op"], entry["problem"], entry["rows_bucket"]))
        family = registry.get(winner.key.op)
        config = family.config_from_dict(winner.config)
        kernel = family.render(config, family.problem(**winner.key.fields),
                               db.device_limits(winner.key.device))
        kept, _, changes = tool.refresh(db_path, fixture, dict(code))
        assert changes == [] and kept["winners"][0] == entry
        metrics = {**winner.metrics, "median_us": winner.metrics["median_us"] * 0.97}
        db.set_winner(winner.key, winner.config, metrics, winner.kernel)
    fresh, fresh_code, changes = tool.refresh(db_path, fixture, dict(code))
    assert changes == [f"tuned again: {entry['op']} {entry['problem']} rows "
                       f"{entry['rows_bucket']} {entry['label']}"]
    (again,) = [e for e in fresh["winners"] if e["name"] == entry["name"]]
    assert again["median_us"] == metrics["median_us"] and again["code"] == winner.kernel
    assert fresh_code[entry["name"]] == code_of(kernel.source)
