"""The shipped tuning database serves the kernels that were timed, rendered by today's code.

Winners are keyed by what runs: each records the digest of its kernel's code
(:func:`autonorm.codegen.environment.kernel_digest`), and lookup uses one only while its
configuration still renders that kernel. These CPU tests render every shipped winner and compare
it with the digest stored beside it and with the kernels the shipped winners were tuned on
(``fixtures/shipped_kernels.json``: names and digests as the autonorm that tuned them rendered
them), so a change to the code that alters a tuned kernel fails here, not silently on an H200.
After the shipped winners change, ``python tools/shipped_fixtures.py`` records the new ones.

A winner whose code changed since it was tuned stays only if the change leaves its machine code
alone: ``fixtures/shipped_code_before.json.gz`` holds the code each shipped kernel was tuned on,
and nvcc must compile it and today's code to the same cubin (the row kernel lost its unused
locals this way, so that it compiles without warnings; docs/tuning.md).
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from autonorm import lookup, settings
from autonorm.ops import registry
from autonorm.runtime.device import DeviceInfo
from autonorm.store.db import SCHEMA_VERSION, TuningDB, TuningKey

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "shipped_kernels.json"
CODE_BEFORE = Path(__file__).resolve().parent / "fixtures" / "shipped_code_before.json.gz"
SHIPPED = Path(__file__).resolve().parent.parent / "autonorm" / "tuning_db" / "autonorm.db"

H200 = DeviceInfo("NVIDIA H200", 90, 132, 62914560, 232448, 6016, 3201000)

EXPECTED = {
    TuningKey(w["device"], w["op"], w["problem"], w["rows_bucket"]): w
    for w in json.loads(FIXTURE.read_text())["winners"]
}
# How many winners the fixture says it holds (tools/shipped_fixtures.py keeps it up to date).
COUNT = int(re.search(r"The (\d+) winners", json.loads(FIXTURE.read_text())["about"]).group(1))


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
    assert len(winners) == len(EXPECTED) == COUNT
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
    assert kernel.name == expected["name"]
    before = json.loads(gzip.decompress(CODE_BEFORE.read_bytes()))[kernel.name]
    assert kernel_digest(before) == expected["code"]  # the code it was tuned on, as recorded
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
        assert len(db.winners()) == COUNT
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


def _cubin(sources: list[str], path: Path) -> bytes:
    """Compile ``sources`` as one translation unit for sm_90 and return the cubin."""
    path.with_suffix(".cu").write_text("\n".join(sources) + "\n")
    done = subprocess.run(
        [shutil.which("nvcc"), "-arch=sm_90", "-std=c++17", "-cubin", "-o", str(path),
         str(path.with_suffix(".cu"))], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return path.read_bytes()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA toolkit)")
def test_every_shipped_winner_compiles_to_the_machine_code_that_was_timed(
    shipped: TuningDB, tmp_path: Path
) -> None:
    from autonorm.codegen.environment import code_of

    before = json.loads(gzip.decompress(CODE_BEFORE.read_bytes()))
    now: dict[str, str] = {}
    for winner in shipped.winners():
        _, _, kernel = _render(shipped, winner)
        now[kernel.name] = code_of(kernel.source)
    assert set(now) == set(before)
    changed = sorted(name for name in now if now[name] != before[name])
    if not changed:
        return
    old = _cubin([before[name] for name in changed], tmp_path / "before.cubin")
    new = _cubin([now[name] for name in changed], tmp_path / "now.cubin")
    if old != new:  # name the kernels whose machine code moved
        moved = [name for name in changed
                 if _cubin([before[name]], tmp_path / f"{name}_b.cubin")
                 != _cubin([now[name]], tmp_path / f"{name}_n.cubin")]
        pytest.fail(f"{len(moved)} shipped kernels compile to other machine code: {moved}")


def test_the_machine_code_check_can_fail(tmp_path: Path) -> None:
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc (the CUDA toolkit)")
    kernel = 'extern "C" __global__ void k(float* y) { y[threadIdx.x] = %s; }'
    same = _cubin([kernel % "1.0f"], tmp_path / "a.cubin")
    assert _cubin([kernel % "1.0f"], tmp_path / "b.cubin") == same
    assert _cubin([kernel % "2.0f"], tmp_path / "c.cubin") != same


@pytest.mark.gpu
def test_every_shipped_winner_verifies_on_an_h200(shipped: TuningDB) -> None:
    # What the CPU tests above cannot show: each shipped kernel, as today's code renders it,
    # compiles under NVRTC and matches float64 on its family's verification cases.
    from autonorm.runtime import compiler
    from autonorm.runtime.device import query_device

    if query_device().fingerprint != H200.fingerprint:
        pytest.skip("the shipped winners were tuned on an H200")
    winners = shipped.winners()
    assert len(winners) == COUNT
    failures = []
    for winner in winners:
        problem, config, rendered = _render(shipped, winner)
        kernel = compiler.compile_kernel(rendered)
        result = registry.get(winner.key.op).workload(problem, 64).verify(kernel)
        if not result.ok:
            failures.append(f"{winner.key} {config.label()}: {result.summary()}")
    assert not failures, "\n".join(failures)
