"""benchmarks/gpu_tests.py without a GPU: how it splits the files, queues them and sums up.

The runs themselves are stand-in processes here (a sleep and an exit status); the tool runs
on the CPU too, where every GPU test skips itself.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_tests  # noqa: E402 - benchmarks/ is not a package

COUNTS = {"tests/a.py": 40, "tests/b.py": 30, "tests/c.py": 20, "tests/d.py": 10,
          "tests/e.py": 10, "tests/f.py": 1}


def test_test_ids_are_counted_by_file_and_warnings_are_not():
    lines = ["tests/a.py::test_x[1]", "tests/a.py::test_x[2]", "tests/b.py::T::test_y",
             "  Test: tests/a.py::test_z, argvalues type: product", "3 tests collected"]
    assert gpu_tests.count_by_file(lines) == {"tests/a.py": 2, "tests/b.py": 1}


@pytest.mark.parametrize("n", [1, 2, 3, 6, 8])
def test_parts_cover_the_files_once_each_and_balance_their_tests(n):
    split = gpu_tests.parts(COUNTS, n)
    assert len(split) == n
    assert sorted(path for part in split for path in part) == sorted(COUNTS)
    loads = [sum(COUNTS[p] for p in part) for part in split]
    assert max(loads) - min(loads) <= max(COUNTS.values())
    if n == 3:
        assert sorted(loads) == [31, 40, 40]


def _sleeper(seconds: float, code: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c",
                             f"import time, sys; time.sleep({seconds}); sys.exit({code})"])


def _python(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code])


def test_the_queue_runs_one_job_a_gpu_and_keeps_every_status(tmp_path):
    # "held" ends only once "last" has run: it holds its GPU while the others take turns on
    # the other one, however slowly each process starts.
    marker = tmp_path / "last_ran"
    plan = {
        "held": f"import pathlib, time\nwhile not pathlib.Path({str(marker)!r}).exists(): "
                "time.sleep(0.05)",
        "fails": "import sys; sys.exit(1)",
        "quick": "pass",
        "last": f"import pathlib; pathlib.Path({str(marker)!r}).touch()",
    }
    started: list[tuple[str, int]] = []

    def start(name: str, gpu: int) -> subprocess.Popen:
        started.append((name, gpu))
        return _python(plan[name])

    status = gpu_tests.run_queue(list(plan), 2, start, time.monotonic() + 120)
    assert status == {"held": 0, "fails": 1, "quick": 0, "last": 0}
    assert started == [("held", 0), ("fails", 1), ("quick", 1), ("last", 1)]


def test_the_deadline_stops_what_runs_and_starts_nothing_more():
    t0 = time.monotonic()
    status = gpu_tests.run_queue(["long", "never"], 1, lambda name, gpu: _sleeper(30, 0),
                                 time.monotonic() + 1.0)
    assert status == {"long": None, "never": None}
    assert time.monotonic() - t0 < 25  # stopped, not slept out


def test_the_summary_says_each_jobs_last_line_then_the_failures(tmp_path):
    gpu_tests.log_of(tmp_path, "tests/a.py").write_text(
        "..F\nFAILED tests/a.py::test_x - assert 1 == 2\n==== 1 failed, 2 passed in 3.0s ====\n")
    gpu_tests.log_of(tmp_path, "tests/b.py").write_text("...\n==== 3 passed in 1.0s ====\n")
    lines, ok = gpu_tests.summarize({"tests/a.py": 1, "tests/b.py": 0, "tests/c.py": None},
                                    tmp_path)
    assert lines == ["tests/a.py: 1 failed, 2 passed in 3.0s", "tests/b.py: 3 passed in 1.0s",
                     "tests/c.py: not run or stopped at the time limit",
                     "FAILED tests/a.py::test_x - assert 1 == 2"]
    assert not ok
    assert gpu_tests.summarize({"tests/b.py": 0}, tmp_path)[1]


def test_a_job_stopped_at_the_limit_says_what_ran_and_what_is_left(tmp_path):
    gpu_tests.log_of(tmp_path, "all").write_text(
        "tests/a.py::test_x PASSED      [ 10%]\ntests/a.py::test_y FAILED      [ 20%]\n"
        "tests/b.py::test_z[1 2] PASSED [ 30%]\n")
    # A finished job's failure, in its verbose line and pytest's summary, is listed once.
    gpu_tests.log_of(tmp_path, "tests/e.py").write_text(
        "tests/e.py::test_w[a b] FAILED [100%]\nFAILED tests/e.py::test_w[a b] - assert 0\n"
        "==== 1 failed in 1.0s ====\n")
    files = {"all": ["tests/a.py", "tests/b.py", "tests/c.py"], "never": ["tests/d.py"]}
    lines, ok = gpu_tests.summarize({"all": None, "never": None, "tests/e.py": 1}, tmp_path,
                                    files)
    assert lines == [
        "all: stopped at the time limit after 1 failed, 2 passed; "
        "left: python -m pytest -m gpu tests/b.py tests/c.py",
        "never: not run or stopped at the time limit",
        "tests/e.py: 1 failed in 1.0s",
        "FAILED tests/a.py::test_y", "FAILED tests/e.py::test_w[a b] - assert 0"]
    assert not ok


def test_a_real_pytest_run_cut_short_is_read_back(tmp_path):
    # pytest's own verbose output, the process killed while its second test runs.
    started = tmp_path / "started"
    tests = tmp_path / "test_cut.py"
    tests.write_text(
        "import pathlib, time\n"
        "def test_quick():\n    pass\n"
        "def test_wrong():\n    assert 1 == 2\n"
        f"def test_hangs():\n    pathlib.Path({str(started)!r}).touch()\n    time.sleep(600)\n")
    marker = gpu_tests.PYTEST.index("gpu")  # these tests carry no marker: not "-m gpu"
    argv = [*gpu_tests.PYTEST[:marker - 1], *gpu_tests.PYTEST[marker + 1:], str(tests)]
    with gpu_tests.log_of(tmp_path, "all").open("w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
        deadline = time.monotonic() + 120
        while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.kill()
        proc.wait()
    lines, ok = gpu_tests.summarize({"all": None}, tmp_path, {"all": ["test_cut.py", "more.py"]})
    assert lines == ["all: stopped at the time limit after 1 failed, 1 passed; "
                     "left: python -m pytest -m gpu test_cut.py more.py",
                     "FAILED test_cut.py::test_wrong"]
    assert not ok


@pytest.mark.parametrize(("argv", "says"), [
    (["--part", "3/3"], "--part: expected K/N"), (["--part", "x"], "--part: expected K/N"),
    (["--gpus", "0"], "--gpus must be >= 1"), (["--timeout", "0"], "--timeout must be > 0"),
])
def test_bad_arguments_end_in_one_line_naming_the_flag(argv, says, capsys):
    with pytest.raises(SystemExit):
        gpu_tests.parse_args(argv)
    assert says in capsys.readouterr().err
