"""The command line's first check: that ``import autonorm`` found this package.

Python imports a directory without an ``__init__.py`` as a namespace package. Run from the
parent directory of a checkout named ``autonorm``, ``import autonorm`` finds the checkout's root
that way, ahead of an editable install (whose finder Python asks after the current directory).
The package's modules still load, through that finder, but the names of its ``__init__.py``
(``autonorm.layer_norm``, ``__version__``) are missing.

No code of autonorm runs on ``import autonorm`` then, so ``autonorm.layer_norm`` fails with
Python's own ``AttributeError`` and nothing here can change that. The command line can say what
happened: importing this module (the first thing :mod:`autonorm.cli` imports, before any module
that reads the package's names) exits with the message when the package is shadowed.
"""

from __future__ import annotations

import sys


def shadowing_directory() -> str | None:
    """Return the directory imported as ``autonorm`` in place of the package, or None."""
    package = sys.modules.get("autonorm")
    if package is None or getattr(package, "__file__", None) is not None:
        return None
    return ", ".join(str(p) for p in getattr(package, "__path__", ())) or "?"


def shadowing_message(directory: str) -> str:
    """The one line that says what ``import autonorm`` found, and what to do."""
    return (
        f"error: `import autonorm` found the directory {directory} (a checkout's root, or another "
        "directory named autonorm) instead of the autonorm package: run from another directory "
        "than its parent, or from inside the checkout"
    )


def require_package() -> None:
    """Exit with :func:`shadowing_message` if ``import autonorm`` found a directory.

    Raises:
        SystemExit: the package is shadowed (status 1, the message on stderr).

    """
    directory = shadowing_directory()
    if directory is not None:
        raise SystemExit(shadowing_message(directory))


require_package()
