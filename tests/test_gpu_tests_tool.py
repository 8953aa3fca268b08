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
        "def test_quick():\n    time.sleep(1.2)\n"
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
    assert lines[0] == ("all: stopped at the time limit after 1 failed, 1 passed; "
                        "left: python -m pytest -m gpu test_cut.py more.py")
    assert lines[-1] == "FAILED test_cut.py::test_wrong"
    # The two tests that ended gave their times: the line of time by file names their file.
    assert len(lines) == 3 and lines[1].startswith("time by file (")
    assert lines[1].endswith(" s in tests): test_cut.py 1 s"), lines[1]
    assert not ok


def test_the_time_by_file_sums_each_tests_time_the_slowest_file_first(tmp_path):
    gpu_tests.log_of(tmp_path, "all").write_text(
        "tests/a.py::test_x PASSED                                   812.5us\n"
        "tests/a.py::test_y[2 3] FAILED                               3.042s\n"
        "tests/b.py::test_z SKIPPED (needs ncu)                       2m 5s\n"
        "tests/c.py::test_w PASSED                                   1h 2m\n"
        "tests/d.py::test_v PASSED                                   [ 90%]\n"
        "tests/e.py::test_u SKIPPED (no GPU)                          1.2ms\n"
        "==== 1 failed, 3 passed in 1h 4m ====\n")
    lines, _ = gpu_tests.summarize({"all": 1}, tmp_path)
    assert lines[1] == ("time by file (3848 s in tests): tests/c.py 3720 s, tests/b.py 125 s, "
                        "tests/a.py 3 s")
    assert gpu_tests.seconds_of("812.5us") == pytest.approx(812.5e-6)
    assert gpu_tests.seconds_of("1h 2m") == 3720.0


def test_collection_counts_the_gpu_tests_of_the_suite_by_file(monkeypatch):
    monkeypatch.chdir(REPO)  # the tool runs from the repository's root
    counts = gpu_tests.collect()
    assert len(counts) >= 30 and counts["tests/test_gpu_backward.py"] >= 10, counts
    assert all(path.startswith("tests/") and n > 0 for path, n in counts.items())


def test_a_part_without_files_runs_nothing(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(gpu_tests, "collect", lambda: {"tests/a.py": 3})

    def no_run(*args, **kwargs):  # noqa: ANN202
        raise AssertionError("a pytest process was started")

    monkeypatch.setattr(gpu_tests.subprocess, "Popen", no_run)
    assert gpu_tests.main(["--part", "1/2", "--out", str(tmp_path)]) == 0
    assert "0 GPU tests in 0 files" in capsys.readouterr().out


def test_the_time_by_file_names_the_slowest_files_only(tmp_path):
    gpu_tests.log_of(tmp_path, "all").write_text("".join(
        f"tests/t{i:02d}.py::test_x PASSED    {i}.000s\n" for i in range(1, 11)))
    line = gpu_tests.summarize({"all": 0}, tmp_path)[0][1]
    assert line.startswith("time by file (55 s in tests): tests/t10.py 10 s, tests/t09.py 9 s")
    assert line.endswith("tests/t03.py 3 s and 2 more")


@pytest.mark.parametrize(("argv", "says"), [
    (["--part", "3/3"], "--part: expected K/N"), (["--part", "x"], "--part: expected K/N"),
    (["--gpus", "0"], "--gpus must be >= 1"), (["--timeout", "0"], "--timeout must be > 0"),
])
def test_bad_arguments_end_in_one_line_naming_the_flag(argv, says, capsys):
    with pytest.raises(SystemExit):
        gpu_tests.parse_args(argv)
    assert says in capsys.readouterr().err
