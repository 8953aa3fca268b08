"""The repository's shape: no import circles, small modules, and a tree that speaks of itself.

CPU only, no imports of the package's modules: the checks read the source.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "autonorm"
MAX_MODULE_LINES = 400


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _type_checking_lines(tree: ast.Module) -> set[int]:
    """Line numbers inside ``if TYPE_CHECKING:`` blocks (imports for annotations only)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports anywhere (function bodies included)."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        skip = _type_checking_lines(tree)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in skip:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in modules else base)
            for target in targets:
                if target in modules and target != name:
                    graph[name].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """Return one import circle as a list of modules, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_cycle_finder_finds_a_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_the_graph_sees_lazy_imports():
    graph = import_graph()
    assert "autonorm.ops.registry" in graph["autonorm.ops.layer_norm.family"] or graph[
        "autonorm.ops.layer_norm.family"]
    # cli imports most of the package inside its commands: the graph must see those edges.
    assert len(graph["autonorm.cli"]) >= 3


def test_the_package_imports_form_no_circle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize("name", sorted(_modules()))
def test_no_module_is_over_the_size_limit(name):
    lines = len(_modules()[name].read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{name} has {lines} lines (limit {MAX_MODULE_LINES})"


# What a diary says and a product does not: sessions, call labels (two digits and a letter
# after an "s"), numbered entries of a lab notebook, the lab's folders. Built from pieces so
# this file does not match itself.
_HISTORY = re.compile(
    "|".join((
        r"\b[Ss]ession[s]? \d",
        r"\bcalls? s\d{1,2}[a-z]?\b",
        r"\bs[12]\d[a-z]\d?\b",
        "NO" + r"TES(\.md)?\b",
        "benchmarks/" + "lab",
        "benchmarks/" + "measured",
    ))
)


def _tracked_text_files() -> list[Path]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT, capture_output=True, text=True, check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    files = []
    for rel in out.splitlines():
        path = ROOT / rel
        if path.suffix in {".db", ".whl", ".png"} or not path.is_file():
            continue
        files.append(path)
    return files


def test_the_history_pattern_matches_what_it_must():
    for text in ("in sess" "ion 26", "ca" "ll s26c", "ran s" "25e", "NO" "TES.md 117",
                 "NO" "TES 34"):
        assert _HISTORY.search(text), text
    for text in ("t256v4r1-bulk-s3-k", "sessions of Optuna", "stages s2", "notes"):
        assert not _HISTORY.search(text), text


def test_no_file_speaks_of_sessions_calls_or_lab_notes():
    here = Path(__file__).resolve()
    found = []
    for path in _tracked_text_files():
        if path.resolve() == here:
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if _HISTORY.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not found, f"{len(found)} lines speak of the lab's history:\n" + "\n".join(found[:40])


def test_lab_folders_are_gone():
    assert not (ROOT / "benchmarks" / "lab").exists()
    assert not (ROOT / "benchmarks" / "measured").exists()
