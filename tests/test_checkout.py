"""``import autonorm`` from the parent directory of a checkout named ``autonorm``.

That directory holds the checkout's root, a directory named ``autonorm`` without an
``__init__.py``, which Python would import as a namespace package. The install must still win:
a regular install, or the editable one, whose ``.pth`` line puts the checkout's root on
``sys.path`` (pyproject.toml keeps every package under the root so that setuptools writes one).
An install reached only through an import hook loses to the directory; the command line then
says so in one line (autonorm.checkout), which a simulated hook checks here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from autonorm import checkout

ROOT = Path(__file__).resolve().parent.parent

# What `import autonorm` gives in the directory a test runs it from.
REPORT = ("import autonorm; print(autonorm.__file__); "
          "print(callable(getattr(autonorm, 'layer_norm', None)))")

# An install Python reaches only through an import hook asked after the search of sys.path, as
# setuptools' editable finder is: the path entries that hold the package are dropped, and a
# finder appended to sys.meta_path loads autonorm's modules from this checkout.
HOOK = f"""
import importlib.machinery, os, sys
root = {str(ROOT)!r}
sys.path[:] = [p for p in sys.path
               if not os.path.isfile(os.path.join(p or ".", "autonorm", "__init__.py"))]

class Finder:
    @staticmethod
    def find_spec(name, path=None, target=None):
        parts = name.split(".")
        if parts[0] != "autonorm":
            return None
        return importlib.machinery.PathFinder.find_spec(name, [os.path.join(root, *parts[:-1])])

sys.meta_path.append(Finder)
sys.argv = ["autonorm", "--help"]
from autonorm.cli import run
run()
"""


@pytest.fixture
def parent(tmp_path: Path) -> Path:
    """A directory holding a checkout-like ``autonorm/`` (no __init__.py at its root)."""
    root = tmp_path / "parent" / "autonorm"
    (root / "autonorm").mkdir(parents=True)
    (root / "README.md").write_text("a checkout\n")
    (root / "pyproject.toml").write_text("[project]\nname = 'autonorm'\n")
    return root.parent


def _python(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """Run this Python in ``cwd`` with the test environment's install (no PYTHONPATH)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["AUTONORM_CACHE_DIR"] = str(cwd.parent / "cache")
    env["AUTONORM_DB"] = str(cwd.parent / "cache" / "autonorm.db")
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=120, check=False)


@pytest.fixture
def installed(tmp_path: Path) -> str:
    """The ``__init__.py`` that ``import autonorm`` finds away from any checkout."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = _python(elsewhere, "-c", REPORT)
    if proc.returncode != 0 or proc.stdout.split()[0] == "None":
        pytest.skip("autonorm is not installed in this environment (the tests import it from "
                    "the working directory or PYTHONPATH), and these tests check what an "
                    "install finds")
    return proc.stdout.split()[0]


def test_import_from_the_parent_of_a_checkout_gives_the_installed_package(
    parent: Path, installed: str
) -> None:
    proc = _python(parent, "-c", REPORT)
    assert proc.returncode == 0, proc.stderr
    found, has_layer_norm = proc.stdout.split()
    assert found == installed, (
        f"`import autonorm` from {parent} found {found} (None: the directory "
        f"{parent / 'autonorm'} as a namespace package) instead of {installed}")
    assert has_layer_norm == "True"


@pytest.mark.parametrize("args", [["-m", "autonorm", "--help"],
                                  ["-m", "autonorm", "show"],
                                  ["-c", "import sys; sys.argv = ['autonorm', '--help'];"
                                         " from autonorm.cli import run; run()"]])
def test_the_command_line_works_from_the_parent_of_a_checkout(
    parent: Path, installed: str, args: list[str]
) -> None:
    proc = _python(parent, *args)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "instead of" not in proc.stderr, proc.stderr
    assert proc.stdout.strip()


def test_the_command_line_says_an_import_hook_install_is_shadowed(parent: Path) -> None:
    proc = _python(parent, "-c", HOOK)
    assert proc.returncode == 1, proc.stdout + proc.stderr
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
