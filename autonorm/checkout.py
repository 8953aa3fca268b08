"""The command line's first check: that ``import autonorm`` found this package.

Python imports a directory without an ``__init__.py`` as a namespace package only when no entry
of ``sys.path`` holds a regular package of that name. Run from the parent directory of a
checkout named ``autonorm``, the current directory holds such a directory (the checkout's root),
yet a regular install still wins, and so does this project's editable install: its ``.pth`` line
puts the checkout's root on ``sys.path``.

An install that Python reaches only through an import hook, asked after the search of
``sys.path`` (setuptools' editable finder, which it writes for layouts a path entry cannot
express), loses to that directory. ``import autonorm`` then gives the namespace package: the
package's modules still load, through the hook, but the names of its ``__init__.py``
(``autonorm.layer_norm``, ``__version__``) are missing, and no autonorm code runs to say why. The
command line can: importing this module (the first thing :mod:`autonorm.cli` imports, before any
module that reads the package's names) exits with the message when the package is shadowed.
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
