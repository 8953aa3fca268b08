"""Run the GPU test suite (``pytest -m gpu``) over every GPU of a machine, or one part of it.

Run on a GPU machine, from the repository root::

    python benchmarks/gpu_tests.py                 # the whole suite, spread over every GPU
    python benchmarks/gpu_tests.py --part 0/3      # the first of three parts, on one GPU

On several GPUs the test files queue, those with the most GPU tests first, and each GPU runs
the next file as soon as it is free (``CUDA_VISIBLE_DEVICES`` naming it), so a slow file does
not hold the others up; a file's tests run in one pytest process, its module fixtures shared
as in the whole suite. On one GPU one pytest process runs them all. ``--part K/N`` runs the
K-th of N parts of the files instead (K from 0), split by their count of GPU tests, so a suite
longer than one command's time limit runs in N commands on a machine of one GPU. Each
process's output goes to a log in ``--out``; the summary gives each one's last line (for one
stopped at the time limit, what its tests did until then and the command that runs the files
it left), then the time the tests took by file, the slowest first (a guide to ``--part`` and
``--timeout``; a run cut short counts the tests that ended), then every failure. The exit
status is 0 only if every test that ran passed.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

# -v: a line a test as it ends, so a log cut short at the time limit still tells what ran;
# the "times" style ends that line with the test's time, so such a log also tells where the
# time went (a pytest without that style prints its progress instead, and no times are read).
PYTEST = [sys.executable, "-m", "pytest", "-v", "-m", "gpu", "-p", "no:cacheprovider", "-ra",
          "-o", "console_output_style=times"]

# Collection, quiet: a line a test id (verbose, it prints the tree of modules instead).
COLLECT = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
           "--collect-only", "tests/"]

# A verbose line: the test's id, then its outcome, then perhaps its time ("812.5us", "3.042s",
# "2m 5s", "1h 2m").
OUTCOME = re.compile(
    r"^(?P<node>\S+?\.py::\S.*?) (?P<outcome>PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b"
    r"(?:.*?\s(?P<time>\d+(?:\.\d+)?(?:us|ms|s)|\d+m \d+s|\d+h \d+m)\s*$)?")
UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}

# The summary's line of time by file names this many files at most, the slowest first.
SLOWEST = 8


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line (no GPU needed for ``--help``)."""
    parser = argparse.ArgumentParser(
        description="Run the GPU tests (pytest -m gpu) file by file over every GPU of this "
                    "machine, or one part of the files on one GPU, and summarize them.")
    parser.add_argument("--part", default=None, metavar="K/N",
                        help="run only the K-th of N parts of the test files (K from 0)")
    parser.add_argument("--gpus", type=int, default=None,
                        help="GPUs to spread the files over (default: every GPU CuPy sees)")
    parser.add_argument("--out", default="/tmp/out",
                        help="folder for each file's log (default: /tmp/out)")
    parser.add_argument("--timeout", type=float, default=540.0,
                        help="seconds in all; a file still running then is stopped "
                             "(default: 540)")
    args = parser.parse_args(argv)
    args.part_of = None
    if args.part is not None:
        k, sep, n = args.part.partition("/")
        if not (sep and k.isdigit() and n.isdigit() and int(k) < int(n)):
            parser.error(f"--part: expected K/N with 0 <= K < N, got {args.part!r}")
        args.part_of = (int(k), int(n))
    if args.gpus is not None and args.gpus < 1:
        parser.error(f"--gpus must be >= 1, got {args.gpus}")
    if not args.timeout > 0:
        parser.error(f"--timeout must be > 0, got {args.timeout:g}")
    return args


def count_by_file(node_ids: Sequence[str]) -> dict[str, int]:
    """Count the collected test ids (``tests/test_x.py::test_y[...]``) of each file."""
    counts: collections.Counter[str] = collections.Counter()
    for node in node_ids:
        path, sep, _ = node.partition("::")
        if sep and path.endswith(".py") and " " not in path:  # not a warning's text
            counts[path] += 1
    return dict(counts)


def by_weight(counts: dict[str, int]) -> list[str]:
    """The files, the most tests first (ties by name): the order they queue in."""
    return sorted(counts, key=lambda path: (-counts[path], path))


def parts(counts: dict[str, int], n: int) -> list[list[str]]:
    """Split the files into ``n`` parts of about equal test counts (each part by name)."""
    loads = [0] * n
    split: list[list[str]] = [[] for _ in range(n)]
    for path in by_weight(counts):
        i = loads.index(min(loads))
        split[i].append(path)
        loads[i] += counts[path]
    return [sorted(part) for part in split]


def collect() -> dict[str, int]:
    """Collect the GPU tests of ``tests/`` without running them: their count by file."""
    run = subprocess.run(COLLECT, capture_output=True, text=True, check=False)
    if run.returncode not in (0, 5):  # 5: nothing collected
        sys.exit(f"gpu_tests: collecting the tests failed:\n{run.stdout[-2000:]}{run.stderr}")
    return count_by_file(run.stdout.splitlines())


def run_queue(jobs: Sequence[str], gpus: int, start: Callable[[str, int], subprocess.Popen],
              deadline: float) -> dict[str, int | None]:
    """Run ``jobs`` in order, at most one a GPU at a time, until each ends or ``deadline``.

    Args:
        jobs: the jobs' names, in the order to start them.
        gpus: how many run at once; each runs on the GPU index it is given.
        start: starts one job on a GPU index and returns its process.
        deadline: ``time.monotonic()`` at which the jobs still running are stopped.

    Returns:
        Each job's exit status; None for a job stopped at the deadline or never started.

    """
    queue = list(jobs)
    running: dict[int, tuple[str, subprocess.Popen]] = {}
    status: dict[str, int | None] = dict.fromkeys(jobs)
    while queue or running:
        for gpu in range(gpus):
            if gpu not in running and queue and time.monotonic() < deadline:
                name = queue.pop(0)
                running[gpu] = (name, start(name, gpu))
        if not running:
            break  # the deadline passed with jobs still queued
        for gpu, (name, proc) in list(running.items()):
            if proc.poll() is not None:
                status[name] = proc.returncode
                del running[gpu]
        if time.monotonic() >= deadline:
            for _, proc in running.values():
                proc.kill()
                proc.wait()
            break
        time.sleep(0.2)
    return status


def log_of(out: Path, name: str) -> Path:
    """The log of one job (a test file, or ``all``) in ``out``."""
    return out / f"gpu_tests_{Path(name).stem}.log"


def seconds_of(text: str) -> float:
    """The seconds of one of pytest's test times: "812.5us", "3.042s", "2m 5s" or "1h 2m"."""
    return sum(float(n) * UNITS[unit] for n, unit in re.findall(r"([\d.]+)(us|ms|s|m|h)", text))


class Ended(NamedTuple):
    """A test a verbose log says ended: its id, its outcome and, where given, its seconds."""

    node: str
    outcome: str
    seconds: float | None


def outcomes(text: Sequence[str]) -> list[Ended]:
    """Each test a verbose log says ended, in order."""
    return [Ended(m["node"], m["outcome"], seconds_of(m["time"]) if m["time"] else None)
            for m in map(OUTCOME.match, text) if m]


def seconds_by_file(ended: Sequence[Ended]) -> dict[str, float]:
    """The seconds the tests of a log's :func:`outcomes` took, summed by file."""
    spent: collections.Counter[str] = collections.Counter()
    for test in ended:
        if test.seconds is not None:
            spent[test.node.partition("::")[0]] += test.seconds
    return dict(spent)


def time_line(spent: dict[str, float]) -> list[str]:
    """The summary's line of where the time went: the files whose tests took a second or more.

    None where no file did (a log without times, or tests that all skipped).
    """
    slowest = sorted((path for path in spent if spent[path] >= 1.0),
                     key=lambda path: (-spent[path], path))
    if not slowest:
        return []
    named = ", ".join(f"{path} {spent[path]:.0f} s" for path in slowest[:SLOWEST])
    more = f" and {len(slowest) - SLOWEST} more" if len(slowest) > SLOWEST else ""
    return [f"time by file ({sum(spent.values()):.0f} s in tests): {named}{more}"]


def stopped_line(name: str, ended: Sequence[Ended], files: Sequence[str]) -> str:
    """Say what a job stopped at the time limit got done, and the command for the rest.

    ``ended`` is the job's :func:`outcomes`. pytest runs the files in the order given: those
    before the last one a test ended in are done, that one and those after it are left.
    """
    if not ended:
        return f"{name}: not run or stopped at the time limit"
    counts = collections.Counter(test.outcome.lower() for test in ended)
    said = ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items()))
    last_file = ended[-1].node.partition("::")[0]
    left = list(files[files.index(last_file):]) if last_file in files else list(files)
    rest = f"; left: python -m pytest -m gpu {' '.join(left)}" if left else ""
    return f"{name}: stopped at the time limit after {said}{rest}"


def summarize(status: dict[str, int | None], out: Path,
              files: dict[str, Sequence[str]] | None = None) -> tuple[list[str], bool]:
    """Return the summary lines and whether all passed.

    The lines: one a job, then where the time went (:func:`time_line`), then the failures.

    Args:
        status: each job's exit status, None where it was stopped at the time limit or never
            started.
        out: the folder of the jobs' logs.
        files: each job's test files, in the order it ran them (default: the job's name).

    """
    lines, failures = [], []
    spent: dict[str, float] = {}
    for name, code in status.items():
        log = log_of(out, name)
        text = log.read_text(errors="replace").splitlines() if log.is_file() else []
        ended = outcomes(text)
        spent.update(seconds_by_file(ended))
        if code is None:
            lines.append(stopped_line(name, ended, (files or {}).get(name, [name])))
        else:
            last = next((ln for ln in reversed(text) if ln.strip()), "no output")
            lines.append(f"{name}: {last.strip('= ')}")
        summary = [ln for ln in text if ln.startswith(("FAILED ", "ERROR "))]
        failures += summary
        named = {ln.partition(" ")[2].partition(" - ")[0] for ln in summary}
        failures += [f"{test.outcome} {test.node}" for test in ended
                     if test.outcome in ("FAILED", "ERROR") and test.node not in named]
    ok = all(code in (0, 5) for code in status.values())  # 5: every test deselected
    return lines + time_line(spent) + failures, ok


def main(argv: list[str] | None = None) -> int:
    """Run the GPU tests as asked; return 0 only if every file passed."""
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.timeout
    gpus = 1 if args.part_of is not None else args.gpus
    if gpus is None:
        # Counting the GPUs needs one; --gpus or --part run the files without counting.
        from peerbench.gpu import require_gpu

        from autonorm.tune.workers import visible_gpu_count

        require_gpu("gpu_tests.py")
        gpus = visible_gpu_count()
    counts = collect()
    if args.part_of is not None:
        k, n = args.part_of
        files = by_weight({p: counts[p] for p in parts(counts, n)[k]})
    else:
        files = by_weight(counts)
    print(f"gpu_tests: {sum(counts[p] for p in files)} GPU tests in {len(files)} files on "
          f"{gpus} GPU{'s' if gpus > 1 else ''}", flush=True)
    if not files:
        return 0  # pytest given no file would run every test of the suite instead
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    names = visible.split(",") if visible else [str(i) for i in range(gpus)]
    # One GPU: one process for every file, no start-up paid per file.
    jobs = {path: [path] for path in files} if gpus > 1 else {"all": list(files)}

    def start(name: str, gpu: int) -> subprocess.Popen:
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": names[gpu % len(names)]}
        with log_of(out, name).open("w") as log:
            return subprocess.Popen([*PYTEST, *jobs[name]], stdout=log,
                                    stderr=subprocess.STDOUT, env=env)

    status = run_queue(list(jobs), gpus, start, deadline)
    lines, ok = summarize(status, out, jobs)
    print("\n".join(lines), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
