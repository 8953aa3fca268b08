"""Read-only tuning databases: read where they cannot be written, and left as they were.

A user database in a read-only directory or file (another user's cache, a read-only container
image) serves ``autonorm show``, ``autonorm export`` and dispatch's lookup, which say once that
tuning results cannot be stored there; ``autonorm tune`` into it fails with one line. A copy of
the shipped database in a read-only directory is read without a ``-wal``, ``-shm`` or
``-journal`` file appearing beside it.

The readers are separate processes. Without root, files and directories are made read-only with
``chmod``; root ignores permissions, so there the reader runs in a private mount namespace
(``unshare -m``) where the directory or file is bind-mounted read-only. Where neither works the
tests skip.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from autonorm import settings
from autonorm.codegen.environment import kernel_digest
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.family import FAMILY
from autonorm.ops.layer_norm.problem import Problem
from autonorm.runtime.device import DeviceInfo
from autonorm.runtime.limits import H200 as H200_LIMITS
from autonorm.store.db import TuningDB, TuningKey

TESTS = Path(__file__).resolve().parent
H200 = DeviceInfo(name="NVIDIA H200", cc=90, sm_count=132, l2_bytes=62914560,
                  smem_optin=232448, mem_bus_bits=6016, mem_clock_khz=3201000)
PROBLEM = Problem(4096, "bfloat16")
CONFIG = KernelConfig(256, 8, 2, "registers", "two_pass", 1, 0)
ROWS = 8192

# Run in the reader process: a fake H200, then what the test asks (argv[1]).
READER = f"""
import json, sys
sys.path.insert(0, {str(TESTS)!r})
import autonorm.runtime.device as device
from autonorm.runtime.device import DeviceInfo
device.query_device = lambda device_id=None: DeviceInfo(
    "NVIDIA H200", 90, 132, 62914560, 232448, 6016, 3201000)
if sys.argv[1] == "dispatch":
    from autonorm import dispatch
    from autonorm.ops.layer_norm.problem import Problem
    problem = Problem(4096, "bfloat16")
    first = dispatch.choose_config(problem, {ROWS})
    again = dispatch.choose_config(problem, {ROWS // 2})  # a second lookup: no second warning
    print(json.dumps([first.source, first.config.label(), again.source]))
else:
    from fake_evaluator import FakeEvaluator
    from autonorm.tune import session
    session._build_evaluator = lambda *args: FakeEvaluator()
    from autonorm import cli
    cli.main(sys.argv[1:])
"""


def _can_run_read_only() -> str | None:
    """Return why read-only runs are impossible here, or None."""
    if os.geteuid() != 0:
        return None
    unshare = shutil.which("unshare")
    if unshare is None:
        return "root ignores file permissions, and unshare (for a read-only mount) is missing"
    probe = Path(os.environ.get("TMPDIR", "/tmp")) / f"autonorm-ro-probe-{os.getpid()}"
    probe.mkdir(exist_ok=True)
    try:
        proc = subprocess.run([unshare, "-m", "sh", "-c", _mount_script([probe]) + "exec true"],
                              capture_output=True, text=True, check=False)
    finally:
        shutil.rmtree(probe, ignore_errors=True)
    if proc.returncode != 0:
        return f"root ignores file permissions, and a read-only mount failed: {proc.stderr}"
    return None


def _mount_script(paths: list[Path]) -> str:
    return "".join(f"mount --bind '{p}' '{p}' && mount -o remount,bind,ro '{p}' && "
                   for p in paths)


WHY_NOT = _can_run_read_only()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))


def run_read_only(paths: list[Path], argv: list[str], env: dict[str, str]
                  ) -> subprocess.CompletedProcess:
    """Run ``argv`` with ``paths`` (files or directories) read-only to it."""
    if os.geteuid() == 0:
        argv = ["unshare", "-m", "sh", "-c", _mount_script(paths) + 'exec "$@"', "sh", *argv]
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300,
                              check=False)
    modes = {p: p.stat().st_mode for p in paths}
    try:
        for p in paths:
            p.chmod(stat.S_IMODE(modes[p]) & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300,
                              check=False)
    finally:
        for p, mode in modes.items():
            p.chmod(stat.S_IMODE(mode))


def _listing(folder: Path) -> list[tuple[str, int, int]]:
    return sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir())


@pytest.fixture
def user_db(tmp_path: Path) -> Path:
    """A user database with one H200 winner, closed (so no -wal or -shm beside it)."""
    folder = tmp_path / "cache"
    folder.mkdir()
    path = folder / "user.db"
    key = TuningKey.for_problem(H200.fingerprint, PROBLEM, ROWS)
    with TuningDB(path) as db:
        db.record_device(H200)
        db.set_winner(key, CONFIG.to_dict(), {"median_us": 10.0, "gbps": 3000.0, "share": 0.9},
                      kernel_digest(FAMILY.render(CONFIG, PROBLEM, H200_LIMITS).source))
    # As if another user's autonorm had written it long ago.
    (folder / "user.db.lock").unlink(missing_ok=True)
    return path


def _env(tmp_path: Path, user: Path, **more: str) -> dict[str, str]:
    env = {**os.environ, "AUTONORM_DB": str(user), "AUTONORM_NO_SHIPPED_DB": "1",
           "AUTONORM_CACHE_DIR": str(tmp_path / "writable-cache"), **more}
    env.pop("AUTONORM_SHIPPED_DB", None)
    return env


def _read_only_warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "is read-only" in line]


@pytest.mark.parametrize("what", ["directory", "file"])
def test_show_export_and_dispatch_read_a_read_only_user_db(
    tmp_path: Path, user_db: Path, what: str
) -> None:
    folder = user_db.parent
    locked = [folder] if what == "directory" else [user_db]
    env = _env(tmp_path, user_db)
    before = _listing(folder)

    show = run_read_only(locked, [sys.executable, "-c", READER, "show", "--all-devices",
                                  "--json"], env)
    assert show.returncode == 0, show.stderr
    [row] = json.loads(show.stdout)
    assert (row["source"], row["config"]) == ("user", CONFIG.to_dict())
    [warning] = _read_only_warnings(show.stderr)
    assert warning.startswith(f"warning: tuning database {user_db} is read-only")
    assert warning.endswith("tuning results cannot be stored there")

    out = tmp_path / "out"
    export = run_read_only(locked, [sys.executable, "-c", READER, "export", "--hidden", "4096",
                                    "-o", str(out)], env)
    assert export.returncode == 0, export.stderr
    manifest = json.loads(next(out.glob("*.json")).read_text())
    assert (manifest["source"], manifest["config"]) == ("user", CONFIG.to_dict())
    assert len(_read_only_warnings(export.stderr)) == 1

    dispatch = run_read_only(locked, [sys.executable, "-c", READER, "dispatch"], env)
    assert dispatch.returncode == 0, dispatch.stderr
    assert json.loads(dispatch.stdout) == ["user", CONFIG.label(), "user-nearest"]
    assert dispatch.stderr.count("ReadOnlyDatabaseWarning") == 1, dispatch.stderr

    if what == "directory":  # nothing could be written, and nothing was
        assert _listing(folder) == before


@pytest.mark.parametrize("what", ["directory", "file"])
def test_tuning_into_a_read_only_user_db_fails_in_one_line(
    tmp_path: Path, user_db: Path, what: str
) -> None:
    env = _env(tmp_path, user_db)
    locked = [user_db.parent] if what == "directory" else [user_db]
    proc = run_read_only(locked, [sys.executable, "-c", READER, "tune", "--hidden", "1024",
                                  "--trials", "2"], env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    [error] = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    # Which it names (the file, or its directory) depends on how it was made read-only.
    assert error.startswith(f"error: tuning database {user_db} is read-only (")
    assert error.endswith("): tuning results cannot be stored there; use a writable file "
                          "(AUTONORM_DB for the user's database)")
    with TuningDB(user_db, read_only=True) as db:
        assert db.trials() == [] and len(db.winners()) == 1


def test_a_read_only_copy_of_the_shipped_db_gets_nothing_beside_it(tmp_path: Path) -> None:
    shipped = settings.shipped_db_path()
    assert shipped is not None and shipped.is_file()
    # Rollback-journal mode (1, 1), not WAL (2, 2): a reader needs no -wal or -shm file.
    assert shipped.read_bytes()[18:20] == b"\x01\x01"
    folder = tmp_path / "site-packages"
    folder.mkdir()
    copy = folder / "autonorm.db"
    shutil.copyfile(shipped, copy)
    before = _listing(folder)
    env = _env(tmp_path, tmp_path / "no-user.db", AUTONORM_SHIPPED_DB=str(copy))
    env.pop("AUTONORM_NO_SHIPPED_DB")
    for argv in (["show", "--all-devices", "--json"],
                 ["export", "--hidden", "16384", "-o", str(tmp_path / "out")],
                 ["dispatch"]):
        proc = run_read_only([folder], [sys.executable, "-c", READER, *argv], env)
        assert proc.returncode == 0, proc.stderr
        assert "shipped" in proc.stdout or "shipped" in proc.stderr
        assert _listing(folder) == before  # no -wal, -shm or -journal, the file untouched
    assert not list(tmp_path.glob("*.db*"))
