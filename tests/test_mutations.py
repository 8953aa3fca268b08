"""CPU: the mutation list of tools/mutations.py still applies to the tree it guards.

``python tools/mutate.py`` (run by CI after the tests) plants each fault and runs its tests; this
checks quickly that every fault can still be planted and names tests that exist.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

from mutate import apply, main, select  # noqa: E402
from mutations import MUTATIONS, Mutation  # noqa: E402


def test_names_are_unique_and_every_mutation_changes_something():
    names = [m.name for m in MUTATIONS]
    assert len(names) == len(set(names))
    assert all(m.old != m.new and m.tests for m in MUTATIONS)


@pytest.mark.parametrize("mutation", MUTATIONS, ids=[m.name for m in MUTATIONS])
def test_each_mutation_applies_and_names_tests_that_exist(mutation: Mutation):
    text = (ROOT / mutation.path).read_text()
    assert mutation.new in apply(text, mutation) or not mutation.new
    for node in mutation.tests:
        path, _, name = node.partition("::")
        function = re.sub(r"\[.*\]$", "", name)
        assert re.search(rf"^def {function}\(", (ROOT / path).read_text(), re.M), node


def test_a_mutation_that_no_longer_applies_is_an_error():
    gone = Mutation("gone", "nothing", "x.py", "absent text", "other", ("t.py::test",))
    with pytest.raises(ValueError, match="no longer applies"):
        apply("some source", gone)
    with pytest.raises(SystemExit, match="unknown mutations"):
        select(["no-such-mutation"])


def test_the_command_lists_its_mutations(capsys):
    assert main(["--list", "-k", "nan-eps"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("nan-eps: validate accepts a NaN") and "test_input_gate" in out
