"""Plant each fault of tools/mutations.py in a scratch copy of the tree; its tests must fail.

Usage (from anywhere in the checkout)::

    python tools/mutate.py            # every mutation; exit 1 if any survives
    python tools/mutate.py --list     # the mutations and the tests that must catch them
    python tools/mutate.py -k nan-eps -k scalar-input

The tree is copied once (the files git tracks, and untracked ones it does not ignore; without
git, the tree less its build and cache folders) into a temporary folder. The tests named by the
mutations run there first on the clean copy: they must all pass, and the copy's own
``autonorm`` must be the one imported. Then each mutation is applied alone, its tests run
(``-x -q -p no:cacheprovider``), and the file is restored. A mutant is killed when pytest
reports a failed test (exit code 1); it survives when its tests pass, and any other outcome
(tests not found, a collection error, a time-out) is an error.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from mutations import MUTATIONS, Mutation

ROOT = Path(__file__).resolve().parent.parent
PYTEST_ARGS = ("-m", "pytest", "-x", "-q", "-p", "no:cacheprovider")


@dataclass(frozen=True)
class Verdict:
    """What running one mutant's tests showed."""

    mutation: Mutation
    status: str  # "killed", "survived" or "error"
    seconds: float
    detail: str = ""


def tracked_files(root: Path) -> list[str]:
    """Return the checkout's files: tracked, and untracked ones git does not ignore."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root, capture_output=True, check=True,
    ).stdout.decode()
    return sorted({name for name in out.split("\0") if name and (root / name).is_file()})


# Left out of the copy where git cannot list the files (a source tree without .git).
IGNORED = (".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
           ".ruff_cache", ".hypothesis", ".whl", "out")


def copy_tree(root: Path, scratch: Path) -> None:
    """Copy the checkout's files into ``scratch``."""
    try:
        names = tracked_files(root)
    except (OSError, subprocess.CalledProcessError):
        shutil.copytree(root, scratch, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns(*IGNORED))
        return
    for name in names:
        target = scratch / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, target)


def environment(scratch: Path) -> dict[str, str]:
    """The environment of the test runs: the scratch copy first on the path, no user state."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTONORM_")}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(scratch), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["AUTONORM_CACHE_DIR"] = str(scratch / ".mutate-cache")
    env["AUTONORM_DB"] = str(scratch / ".mutate-cache" / "user.db")
    return env


def run_tests(
    python: str, scratch: Path, tests: tuple[str, ...], timeout_s: float
) -> tuple[int | None, str]:
    """Run pytest on ``tests`` in ``scratch``; return (exit code or None on time-out, output)."""
    try:
        proc = subprocess.run(
            [python, *PYTEST_ARGS, *tests], cwd=scratch, env=environment(scratch),
            capture_output=True, text=True, timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout_s:g} s"
    return proc.returncode, proc.stdout + proc.stderr


def apply(text: str, mutation: Mutation) -> str:
    """Return ``text`` with the mutation applied.

    Raises:
        ValueError: ``old`` does not occur exactly ``count`` times.
    """
    found = text.count(mutation.old)
    if found != mutation.count:
        raise ValueError(
            f"{mutation.name}: {mutation.old!r} occurs {found} times in {mutation.path}, "
            f"expected {mutation.count}: the mutation no longer applies"
        )
    return text.replace(mutation.old, mutation.new)


def check_copy(python: str, scratch: Path) -> None:
    """Make sure the tests will import the scratch copy's autonorm, not an installed one."""
    code = "import autonorm, pathlib; print(pathlib.Path(autonorm.__file__).resolve())"
    proc = subprocess.run([python, "-c", code], cwd=scratch, env=environment(scratch),
                          capture_output=True, text=True, check=True)
    imported = Path(proc.stdout.strip())
    if scratch.resolve() not in imported.parents:
        raise SystemExit(f"the tests would import {imported}, not the scratch copy's autonorm")


def run_mutant(python: str, scratch: Path, mutation: Mutation, timeout_s: float) -> Verdict:
    """Apply one mutation to the scratch copy, run its tests, restore the file."""
    path = scratch / mutation.path
    original = path.read_text()
    started = time.monotonic()
    try:
        path.write_text(apply(original, mutation))
    except ValueError as exc:
        return Verdict(mutation, "error", 0.0, str(exc))
    try:
        code, output = run_tests(python, scratch, mutation.tests, timeout_s)
    finally:
        path.write_text(original)
    seconds = time.monotonic() - started
    if code == 1:
        return Verdict(mutation, "killed", seconds)
    if code == 0:
        return Verdict(mutation, "survived", seconds, "its tests passed")
    detail = output.strip().splitlines()[-1] if output.strip() else "no output"
    return Verdict(mutation, "error", seconds, f"pytest exit code {code}: {detail}")


def select(names: list[str] | None) -> list[Mutation]:
    """Return the mutations named (all of them when none is)."""
    if not names:
        return list(MUTATIONS)
    known = {m.name: m for m in MUTATIONS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown mutations: {', '.join(unknown)} (see --list)")
    return [known[n] for n in names]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Read the command line."""
    parser = argparse.ArgumentParser(
        prog="python tools/mutate.py",
        description="Apply each mutation of autonorm's gate (tools/mutations.py) to a scratch "
        "copy of the tree and run the tests that must catch it. Exit status 1 when a mutant "
        "survives or cannot be judged.",
    )
    parser.add_argument("-k", "--only", action="append", metavar="NAME",
                        help="run this mutation only (repeatable)")
    parser.add_argument("--list", action="store_true",
                        help="print the mutations and their tests, run nothing")
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter that runs pytest (default: this one)")
    parser.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                        help="time limit of one mutant's tests (default 300)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch copy")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the mutations; return the exit status."""
    args = parse_args(argv)
    mutations = select(args.only)
    if args.list:
        for m in mutations:
            print(f"{m.name}: {m.what}\n  {m.path}\n  " + "\n  ".join(m.tests))
        return 0
    names = [m.name for m in MUTATIONS]
    if len(set(names)) != len(names):
        raise SystemExit("mutation names must be unique")
    started = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="autonorm-mutate-"))
    try:
        copy_tree(ROOT, scratch)
        check_copy(args.python, scratch)
        tests = tuple(dict.fromkeys(t for m in mutations for t in m.tests))
        code, output = run_tests(args.python, scratch, tests, args.timeout * 2)
        if code != 0:
            print(output[-4000:])
            print(f"the clean copy fails its mutation tests (exit code {code}): fix that first")
            return 1
        print(f"clean copy: {len(tests)} test ids pass ({time.monotonic() - started:.0f} s)")
        verdicts = []
        for mutation in mutations:
            verdict = run_mutant(args.python, scratch, mutation, args.timeout)
            verdicts.append(verdict)
            note = f"  ({verdict.detail})" if verdict.detail else ""
            print(f"{verdict.status:8} {mutation.name:40} {verdict.seconds:5.1f} s{note}",
                  flush=True)
    finally:
        if args.keep:
            print(f"scratch copy kept at {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    counts = {s: sum(v.status == s for v in verdicts) for s in ("killed", "survived", "error")}
    print(f"{len(verdicts)} mutants: {counts['killed']} killed, {counts['survived']} survived, "
          f"{counts['error']} errors in {time.monotonic() - started:.0f} s")
    return 0 if counts["killed"] == len(verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
