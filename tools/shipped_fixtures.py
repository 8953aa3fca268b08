"""Bring the test fixtures of the shipped tuning database up to date with its winners.

``tests/test_shipped_kernels.py`` checks every winner of ``autonorm/tuning_db/autonorm.db``
against ``tests/fixtures/shipped_kernels.json`` (each winner's kernel name and code digest as
the autonorm that tuned it rendered it) and ``tests/fixtures/shipped_code_before.json.gz``
(that code). After tuning adds or replaces shipped winners, run from the repository root::

    python tools/shipped_fixtures.py          # writes the fixtures, says what changed
    python tools/shipped_fixtures.py --check  # writes nothing; exit 1 if they are out of date

A winner the fixtures lack, whose configuration differs from theirs (a replaced winner), or
whose time differs from theirs (the same configuration tuned again, as after a change to its
kernel's code) is recorded as today's code renders it, which must give the digest the database
stored when it was timed; fixtures of winners no longer shipped are dropped; the others stay as
they are (the code they were tuned on, which a change that leaves the machine code alone may
since have migrated). Each fixture keeps its winner's ``median_us`` to tell a winner tuned
again from one kept. The count in the fixture's ``about`` follows.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "autonorm" / "tuning_db" / "autonorm.db"
FIXTURE = ROOT / "tests" / "fixtures" / "shipped_kernels.json"
CODE_BEFORE = ROOT / "tests" / "fixtures" / "shipped_code_before.json.gz"
COUNT = re.compile(r"The \d+ winners")


def refresh(db_path: Path, fixture: dict, code: dict[str, str]) -> tuple[dict, dict, list[str]]:
    """Return the fixture and the code brought up to date with ``db_path``, and what changed.

    Raises:
        SystemExit: a winner's configuration no longer renders the kernel that was timed.
    """
    from autonorm.codegen.environment import code_of, kernel_digest
    from autonorm.ops import registry
    from autonorm.store.db import TuningDB

    held = {(w["device"], w["op"], w["problem"], w["rows_bucket"]): w
            for w in fixture["winners"]}
    entries, changes = [], []
    with TuningDB(db_path, read_only=True, immutable=True, source="shipped") as db:
        for winner in db.winners():
            key = (winner.key.device, winner.key.op, winner.key.problem, winner.key.rows_bucket)
            entry = held.get(key)
            family = registry.get(winner.key.op)
            config = family.config_from_dict(winner.config)
            timed = (winner.metrics or {}).get("median_us")
            same = entry is not None and entry["label"] == config.label()
            if same and entry["median_us"] == timed:
                entries.append(entry)  # as it was tuned (its code may since have been migrated)
                continue
            problem = family.problem(**winner.key.fields)
            kernel = family.render(config, problem, db.device_limits(winner.key.device))
            if kernel_digest(kernel.source) != winner.kernel:
                raise SystemExit(f"{winner.key.op} {winner.key.problem} rows "
                                 f"{winner.key.rows_bucket}: {config.label()} no longer renders "
                                 "the kernel that was timed; tune it again")
            entries.append({"device": key[0], "op": key[1], "problem": key[2],
                            "rows_bucket": key[3], "label": config.label(),
                            "name": kernel.name, "code": winner.kernel, "median_us": timed})
            code[kernel.name] = code_of(kernel.source)
            what = "tuned again" if same else "replaced" if entry else "added"
            changes.append(f"{what}: {key[1]} {key[2]} rows {key[3]} {config.label()}")
    kept = {(e["device"], e["op"], e["problem"], e["rows_bucket"]) for e in entries}
    for key, entry in held.items():
        if key not in kept:
            changes.append(f"dropped: {key[1]} {key[2]} rows {key[3]} {entry['label']}")
    names = {e["name"] for e in entries}
    code = {name: text for name, text in code.items() if name in names}
    about = COUNT.sub(f"The {len(entries)} winners", fixture["about"], count=1)
    return {**fixture, "about": about, "winners": entries}, code, changes


def main(argv: list[str] | None = None) -> int:
    """Refresh (or with ``--check`` only compare) the fixtures; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if the fixtures are out of date")
    parser.add_argument("--db", type=Path, default=SHIPPED, help="the shipped database")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    fixture = json.loads(FIXTURE.read_text())
    code = json.loads(gzip.decompress(CODE_BEFORE.read_bytes()))
    fresh, fresh_code, changes = refresh(args.db, fixture, dict(code))
    for line in changes:
        print(line)
    print(f"{len(fresh['winners'])} winners, {len(changes)} changed")
    if args.check:
        return 1 if changes else 0
    if changes:
        FIXTURE.write_text(json.dumps(fresh, indent=1))
        CODE_BEFORE.write_bytes(gzip.compress(json.dumps(fresh_code).encode(), mtime=0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
