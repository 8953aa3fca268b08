"""A directory named ``autonorm`` that shadows the package (a checkout, run from its parent).

``import autonorm`` from the parent of a checkout named ``autonorm`` finds the checkout's root as
a namespace package, ahead of an editable install. No autonorm code runs then, so
``autonorm.layer_norm`` fails with Python's own AttributeError (autonorm.checkout explains why
nothing can hook it); the command line, whose modules still load, says what happened in one
line. Where the install is not editable, the installed package wins and everything works.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from autonorm import checkout


@pytest.fixture
def parent(tmp_path: Path) -> Path:
    """A directory holding a checkout-like ``autonorm/`` (no __init__.py at its root)."""
    root = tmp_path / "autonorm"
    (root / "autonorm").mkdir(parents=True)
    (root / "README.md").write_text("a checkout\n")
    (root / "pyproject.toml").write_text("[project]\nname = 'autonorm'\n")
    return tmp_path


def _python(parent: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, *args], cwd=parent, capture_output=True, text=True,
                          env=env, timeout=120, check=False)


def _shadowed(parent: Path) -> bool:
    """Whether `import autonorm` from ``parent`` finds the directory (an editable install)."""
    proc = _python(parent, "-c", "import autonorm; print(autonorm.__file__)")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip() == "None"


@pytest.mark.parametrize("args", [["-m", "autonorm", "--help"],
                                  ["-m", "autonorm", "show"],
                                  ["-c", "from autonorm.cli import run; run()"]])
def test_the_command_line_says_a_checkout_shadows_the_package(
    parent: Path, args: list[str]
) -> None:
    proc = _python(parent, *args)
    if not _shadowed(parent):  # an installed package wins over the directory: all is well
        assert "Traceback" not in proc.stderr and "instead of" not in proc.stderr, proc.stderr
        return
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip() == checkout.shadowing_message(str(parent / "autonorm"))
    assert "instead of the autonorm package" in proc.stderr


def test_the_package_itself_is_not_shadowed() -> None:
    assert checkout.shadowing_directory() is None
    checkout.require_package()  # returns


def test_a_namespace_package_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import types

    namespace = types.ModuleType("autonorm")
    namespace.__path__ = [str(tmp_path / "autonorm")]  # what Python sets; no __file__
    monkeypatch.setitem(sys.modules, "autonorm", namespace)
    assert checkout.shadowing_directory() == str(tmp_path / "autonorm")
    with pytest.raises(SystemExit) as info:
        checkout.require_package()
    assert str(info.value).startswith(f"error: `import autonorm` found the directory "
                                      f"{tmp_path / 'autonorm'} (a checkout's root")
