"""What a wheel of autonorm holds: pyproject.toml names every package and the shipped data.

pyproject.toml lists its packages by hand, and an editable install (the project root on
sys.path) imports a package the list forgets, so only an installed wheel would miss it.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="tomllib arrived in Python 3.11")

ROOT = Path(__file__).resolve().parent.parent
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_of_the_tree_is_listed() -> None:
    tree = {".".join(p.parent.relative_to(ROOT).parts)
            for p in (ROOT / "autonorm").rglob("__init__.py")}
    assert tree - set(SETUPTOOLS["packages"]) == set()


@pytest.mark.parametrize("name", ["autonorm.db", "models.json"])
def test_the_shipped_data_is_package_data(name: str) -> None:
    assert (ROOT / "autonorm" / "tuning_db" / name).is_file()
    assert "autonorm.tuning_db" in SETUPTOOLS["packages"]
    patterns = SETUPTOOLS["package-data"]["autonorm.tuning_db"]
    assert any(fnmatch.fnmatch(name, pattern) for pattern in patterns)


def test_every_template_is_package_data() -> None:
    templates = list((ROOT / "autonorm").rglob("*.j2"))
    assert len(templates) >= 9
    for path in templates:
        package = ".".join(path.parent.relative_to(ROOT).parts)
        assert package in SETUPTOOLS["packages"], path
        patterns = SETUPTOOLS["package-data"].get(package, []) + SETUPTOOLS["package-data"]["*"]
        assert any(fnmatch.fnmatch(path.name, pattern) for pattern in patterns), path


def test_the_package_is_typed_and_its_lazy_names_are_typed_too() -> None:
    import ast

    import autonorm

    assert (ROOT / "autonorm" / "py.typed").is_file()
    assert "py.typed" in SETUPTOOLS["package-data"]["autonorm"]
    tree = ast.parse((ROOT / "autonorm" / "__init__.py").read_text())
    checking = next(node for node in tree.body if isinstance(node, ast.If)
                    and ast.unparse(node.test) == "TYPE_CHECKING")
    typed = {alias.name for node in checking.body if isinstance(node, ast.ImportFrom)
             for alias in node.names}
    lazy = set(autonorm.__all__) - {"AutonormError", "__version__"}
    assert typed == lazy
    for name in lazy:  # each is what the lazy attribute gives at run time
        assert getattr(autonorm, name).__name__ == name
