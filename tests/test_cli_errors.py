"""Every path of the ``autonorm`` command line ends in one line, never a traceback.

Each verb runs with bad options (negative, zero, huge and non-numeric values, unknown dtypes and
ops, bad ``--config`` JSON, ``-o`` at a file) and bad environment variables (the cache directory
a file, the user database in a missing directory or a directory itself, the shipped database
garbage). A bad input exits non-zero with exactly one ``error: ...`` line on stderr; a fine one
exits 0. Warnings are ``warning: ...`` lines, without Python's source line. ``tune`` runs on a
fake H200 with the fake evaluator, so the walk needs no GPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from autonorm import __version__, cli
from autonorm.runtime.device import DeviceInfo

H200 = DeviceInfo(name="NVIDIA H200", cc=90, sm_count=132, l2_bytes=62914560,
                  smem_optin=232448, mem_bus_bits=6016, mem_clock_khz=3201000)
HUGE = "9" * 30
FIXED = ["--hidden", "1024"]


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A tmp cache and user DB, no shipped DB, a fake H200 and the fake evaluator."""
    from fake_evaluator import FakeEvaluator

    import autonorm.runtime.device
    from autonorm.tune import session

    monkeypatch.setenv("AUTONORM_DB", str(tmp_path / "user.db"))
    monkeypatch.setenv("AUTONORM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("AUTONORM_NO_SHIPPED_DB", "1")
    monkeypatch.delenv("AUTONORM_SHIPPED_DB", raising=False)
    monkeypatch.setattr(autonorm.runtime.device, "query_device", lambda device_id=None: H200)
    monkeypatch.setattr(session, "_build_evaluator", lambda *args: FakeEvaluator())
    (tmp_path / "a_file").write_text("not a directory\n")
    return tmp_path


def invoke(args: list[str]) -> tuple[int, str, str]:
    """Run the CLI as the console script does; return (status, stdout, stderr)."""
    result = CliRunner().invoke(cli.main, args)
    # Every way out is a deliberate exit: an exception other than SystemExit would be a crash.
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        result.exc_info)
    return result.exit_code, result.stdout, result.stderr


def assert_one_error_line(status: int, stdout: str, stderr: str, expected: str) -> str:
    assert status != 0, stdout + stderr
    assert "Traceback" not in stdout + stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    # Besides warnings, only tune's opening line ("autonorm 0.1.0: tuning ...") may precede it.
    errors = [line for line in lines
              if not line.startswith(("warning: ", f"autonorm {__version__}: tuning "))]
    assert len(errors) == 1 and errors[0].startswith("error: "), stderr
    assert expected in errors[0], errors[0]
    assert "unexpected" not in errors[0]
    return errors[0]


# (arguments, what the error line says); {tmp} is the test's directory.
BAD_OPTIONS = [
    (["tune", "--hidden", "-1"], "'--hidden': -1 is not in the range x>=1"),
    (["tune", "--hidden", "0"], "'--hidden': 0 is not in the range x>=1"),
    (["tune", "--hidden", "abc"], "'--hidden': 'abc' is not a valid integer"),
    (["tune", *FIXED, "--rows", "0"], "'--rows': 0 is not in the range"),
    (["tune", *FIXED, "--rows", "-5"], "'--rows': -5 is not in the range"),
    (["tune", *FIXED, "--rows", HUGE], "'--rows'"),
    (["tune", *FIXED, "--trials", "0"], "'--trials': 0 is not in the range"),
    (["tune", *FIXED, "--trials", "many"], "'--trials': 'many' is not a valid integer"),
    (["tune", *FIXED, "--timeout", "0"], "'--timeout': 0.0 is not in the range x>0"),
    (["tune", *FIXED, "--timeout", "-3"], "'--timeout': -3.0 is not in the range x>0"),
    (["tune", *FIXED, "--timeout", "nan"], "'--timeout': nan is not a number of seconds"),
    (["tune", *FIXED, "--workers", "0"], "'--workers': 0 is not in the range x>=1"),
    (["tune", *FIXED, "--seed", "-1"], "'--seed': -1 is not in the range"),
    (["tune", *FIXED, "--seed", HUGE], "'--seed'"),
    (["tune", *FIXED, "--dtype", "int8"], "unsupported dtype 'int8'"),
    (["tune", *FIXED, "--op", "group_norm"], "'group_norm' is not a known op"),
    (["tune", "--hidden", HUGE], "unsupported hidden size"),
    (["tune"], "Missing option '--hidden'"),
    (["show", "--op", "nope"], "'nope' is not a known op"),
    (["show", "--bogus"], "No such option '--bogus'"),
    (["export", *FIXED], "Missing option '-o'"),
    (["export", *FIXED, "-o", "{tmp}/out", "--rows", "-5"], "'--rows': -5 is not in the range"),
    (["export", *FIXED, "-o", "{tmp}/out", "--rows", "0"], "'--rows': 0 is not in the range"),
    (["export", *FIXED, "-o", "{tmp}/out", "--rows", HUGE], "'--rows'"),
    (["export", *FIXED, "-o", "{tmp}/out", "--rows", "x"], "'x' is not a valid integer"),
    (["export", "--hidden", "-4", "-o", "{tmp}/out"], "'--hidden': -4 is not in the range"),
    (["export", "--hidden", HUGE, "-o", "{tmp}/out"], "unsupported hidden size"),
    (["export", *FIXED, "-o", "{tmp}/out", "--dtype", "float64"], "unsupported dtype"),
    (["export", *FIXED, "-o", "{tmp}/out", "--arch", "sm_7"], "not a GPU architecture"),
    (["export", *FIXED, "-o", "{tmp}/out", "--arch", "sm_77"], "knows the limits of sm_75, sm_80"),
    (["export", *FIXED, "-o", "{tmp}/a_file"], "is a file"),
    (["export", *FIXED, "-o", "{tmp}/a_file/sub"], "cannot write the export into"),
    (["render", "--hidden", "0"], "'--hidden': 0 is not in the range"),
    (["render", "--hidden", HUGE], "unsupported hidden size"),
    (["render", *FIXED, "--dtype", "bf8"], "unsupported dtype 'bf8'"),
    (["render", *FIXED, "--threads", "7"], "'7' is not one of"),
    (["render", *FIXED, "--vec", "8", "--dtype", "fp32", "--threads", "32"], "vec"),
    (["render", *FIXED, "--config", "{"], "not JSON"),
    (["render", *FIXED, "--config", "[1, 2]"], "must be a JSON object"),
    (["render", *FIXED, "--config", '{"colour": 1}'], "has no field colour"),
    (["render", *FIXED, "--config", '{"threads": "x"}'], 'threads takes an integer'),
    (["render", *FIXED, "--config", '{"threads": true}'], "threads takes an integer"),
    (["render", *FIXED, "--config", '{"keep_x": 1}'], "keep_x takes true or false"),
    (["render", *FIXED, "--config", '{"cache": 5}'], "cache takes a string"),
    (["render", *FIXED, "--config", '{"threads": 7}'], "threads must be one of"),
    (["render", *FIXED, "--config", '{"threads": -1}'], "threads must be one of"),
    (["bogus"], "No such command 'bogus'"),
    (["db", "bogus"], "No such command 'bogus'"),
    (["db", "export"], "Missing option '-o'"),
    (["db", "export", "-o", "{tmp}/w.json"], "nothing to export"),
    (["db", "export", "-o", "{tmp}/w.json", "--hidden", "0"], "'--hidden': 0 is not in the range"),
    (["db", "export", "-o", "{tmp}/w.json", "--hidden", "x"], "'x' is not a valid integer"),
    (["db", "export", "-o", "{tmp}/w.json", "--dtype", "int8"], "unsupported dtype 'int8'"),
    (["db", "export", "-o", "{tmp}/w.json", "--op", "nope"], "'nope' is not a known op"),
    (["db", "export", "-o", "{tmp}"], "is a directory"),
    (["db", "import"], "Missing argument 'SOURCE'"),
    (["db", "import", "{tmp}/missing.json"], "does not exist"),
    (["db", "import", "{tmp}"], "is a directory"),
    (["db", "import", "{tmp}/a_file"], "neither a winners file (JSON) nor an autonorm database"),
    (["db", "import", "{tmp}/a_file", "--bogus"], "No such option '--bogus'"),
    (["db", "check", "--bogus"], "No such option '--bogus'"),
]


@pytest.mark.parametrize(("args", "expected"), BAD_OPTIONS,
                         ids=[" ".join(a)[:60] for a, _ in BAD_OPTIONS])
def test_a_bad_option_ends_in_one_error_line(env: Path, args: list[str], expected: str) -> None:
    args = [a.replace("{tmp}", str(env)) for a in args]
    assert_one_error_line(*invoke(args), expected)


def _export(tmp: Path) -> list[str]:
    return ["export", *FIXED, "-o", str(tmp / "out")]


# (environment changes, command, what the error line says, or None where the input is fine).
BAD_ENVIRONMENTS = [
    ({"AUTONORM_CACHE_DIR": "{tmp}/a_file"}, ["show"], None),
    ({"AUTONORM_CACHE_DIR": "{tmp}/a_file"}, "export", None),
    ({"AUTONORM_CACHE_DIR": "{tmp}/a_file"}, ["render", *FIXED], None),
    ({"AUTONORM_CACHE_DIR": "{tmp}/a_file", "AUTONORM_DB": None},
     ["tune", *FIXED, "--trials", "2"], "cannot create the directory of tuning database"),
    ({"AUTONORM_CACHE_DIR": "{tmp}/a_file"}, ["tune", *FIXED, "--trials", "2"],
     "{tmp}/a_file"),
    ({"AUTONORM_DB": "{tmp}/missing/dir/user.db"}, ["show"], None),
    ({"AUTONORM_DB": "{tmp}/missing/dir/user.db"}, "export", None),
    ({"AUTONORM_DB": "{tmp}/missing/dir/user.db"}, ["tune", *FIXED, "--trials", "2"], None),
    ({"AUTONORM_DB": "{tmp}/a_file/user.db"}, ["show"], None),
    ({"AUTONORM_DB": "{tmp}/a_file/user.db"}, ["tune", *FIXED, "--trials", "2"],
     "cannot create the directory of tuning database"),
    ({"AUTONORM_DB": "{tmp}"}, ["show"], "is not a file"),
    ({"AUTONORM_DB": "{tmp}"}, "export", "is not a file"),
    ({"AUTONORM_DB": "{tmp}"}, ["tune", *FIXED, "--trials", "2"], "is a directory"),
    ({"AUTONORM_SHIPPED_DB": "{tmp}/a_file", "AUTONORM_NO_SHIPPED_DB": None}, ["show"],
     "is corrupt"),
    ({"AUTONORM_SHIPPED_DB": "{tmp}/a_file", "AUTONORM_NO_SHIPPED_DB": None}, "export",
     "is corrupt"),
    ({"AUTONORM_SHIPPED_DB": "{tmp}/a_file", "AUTONORM_NO_SHIPPED_DB": None},
     ["render", *FIXED], None),
    ({"AUTONORM_SHIPPED_DB": "{tmp}/missing.db", "AUTONORM_NO_SHIPPED_DB": None}, ["show"],
     None),
    ({"AUTONORM_DB": "{tmp}/missing/dir/user.db"}, ["db", "check"], None),
    ({"AUTONORM_DB": "{tmp}/a_file/user.db"}, ["db", "check"], None),
    ({"AUTONORM_DB": "{tmp}"}, ["db", "check"], "is not a file"),
    ({"AUTONORM_DB": "{tmp}/a_file"}, ["db", "check"], "is corrupt"),
    ({"AUTONORM_CACHE_DIR": "{tmp}/a_file"}, ["db", "check"], None),
]


@pytest.mark.parametrize(("changes", "args", "expected"), BAD_ENVIRONMENTS,
                         ids=[f"{'+'.join(c)}-{a if isinstance(a, str) else a[0]}-{i}"
                              for i, (c, a, _) in enumerate(BAD_ENVIRONMENTS)])
def test_a_bad_environment_ends_in_one_line_or_works(
    env: Path, monkeypatch: pytest.MonkeyPatch, changes: dict[str, str | None],
    args: list[str] | str, expected: str | None,
) -> None:
    for name, value in changes.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value.replace("{tmp}", str(env)))
    args = _export(env) if args == "export" else args
    status, stdout, stderr = invoke(args)
    if expected is None:
        assert status == 0, stdout + stderr
        assert "Traceback" not in stdout + stderr and "error:" not in stderr
        assert ".py:" not in stderr  # no warning with Python's source line
    else:
        assert_one_error_line(status, stdout, stderr, expected.replace("{tmp}", str(env)))


def test_warnings_are_plain_lines(env: Path) -> None:
    """A corrupt user DB set aside and an untuned default exported: two `warning:` lines."""
    (env / "user.db").write_bytes(b"this is not an SQLite database\n" * 100)
    status, stdout, stderr = invoke(_export(env))
    assert status == 0, stderr
    warnings = [line for line in stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 2, stderr
    assert warnings[0].startswith(f"warning: tuning database {env / 'user.db'} is corrupt")
    assert warnings[1].startswith("warning: nothing is tuned for bfloat16 hidden 1024")
    for noise in ("CorruptDatabaseWarning", "DefaultConfigWarning", ".py:", "warnings.warn"):
        assert noise not in stderr


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["show", "--help"], ["db", "--help"],
                                  ["db", "import", "--help"]])
def test_help_and_version_exit_zero(env: Path, args: list[str]) -> None:
    status, stdout, stderr = invoke(args)
    assert status == 0 and stdout and not stderr


def test_no_command_shows_the_help(env: Path) -> None:
    status, stdout, stderr = invoke([])
    assert status != 0 and "Usage:" in stdout + stderr and "Commands:" in stdout + stderr
    assert "Traceback" not in stdout + stderr and "error:" not in stdout + stderr


def test_an_interrupt_is_one_line(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("autonorm.export.export_tuned", interrupted)
    status, stdout, stderr = invoke(_export(env))
    assert status == 130
    assert [line for line in stderr.splitlines() if line.strip()] == ["error: interrupted"]


@pytest.mark.parametrize(
    ("changes", "args", "expected"),
    [({"AUTONORM_SHIPPED_DB": "{tmp}/a_file"}, ["show"], "is corrupt: file is not a database"),
     ({}, ["export", "--hidden", "64", "--rows", "-5", "-o", "{tmp}/z"], "'--rows': -5"),
     ({"AUTONORM_CACHE_DIR": "{tmp}/a_file"}, ["show", "--all-devices"], None),
     ({"AUTONORM_DB": "{tmp}/a_file"}, ["db", "check"], "is corrupt: the integrity check")],
)
def test_the_real_entry_point_prints_one_line(
    tmp_path: Path, changes: dict[str, str], args: list[str], expected: str | None
) -> None:
    (tmp_path / "a_file").write_text("not a database\n")
    environ = {**os.environ, "AUTONORM_DB": str(tmp_path / "user.db"),
               "AUTONORM_CACHE_DIR": str(tmp_path / "cache")}
    environ.pop("AUTONORM_NO_SHIPPED_DB", None)
    environ.update({k: v.replace("{tmp}", str(tmp_path)) for k, v in changes.items()})
    proc = subprocess.run(
        [sys.executable, "-m", "autonorm", *[a.replace("{tmp}", str(tmp_path)) for a in args]],
        capture_output=True, text=True, env=environ, timeout=120, check=False,
    )
    if expected is None:
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    else:
        assert_one_error_line(proc.returncode, proc.stdout, proc.stderr, expected)
