"""Every path and environment variable autonorm reads, in one place.

Environment variables:
    AUTONORM_DB: path of the user's tuning database (default: per-user cache dir).
    AUTONORM_CACHE_DIR: root of autonorm's per-user cache (compiled kernels, studies).
    AUTONORM_SHIPPED_DB: override the path of the read-only shipped database.
    AUTONORM_NO_SHIPPED_DB: set to 1 to ignore the shipped database (tests, A/B runs).
"""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def templates_dir() -> Path:
    """Return the directory holding the Jinja templates.

    The templates ship inside the package (``autonorm/templates`` in a wheel); in a source
    checkout the top-level ``templates/`` is used, which is the same content.
    """
    packaged = _PACKAGE_DIR / "templates"
    if packaged.is_dir():
        return packaged
    return _PACKAGE_DIR.parent / "templates"


def shipped_db_path() -> Path | None:
    """Return the read-only tuning database shipped with autonorm, or None if disabled."""
    if os.environ.get("AUTONORM_NO_SHIPPED_DB", "") not in ("", "0"):
        return None
    override = os.environ.get("AUTONORM_SHIPPED_DB")
    if override:
        return Path(override)
    packaged = _PACKAGE_DIR / "tuning_db" / "autonorm.db"
    if packaged.is_file():
        return packaged
    return _PACKAGE_DIR.parent / "tuning_db" / "autonorm.db"


def cache_dir() -> Path:
    """Return autonorm's per-user cache directory (not created here)."""
    override = os.environ.get("AUTONORM_CACHE_DIR")
    if override:
        return Path(override)
    import platformdirs

    return Path(platformdirs.user_cache_dir("autonorm"))


def user_db_path() -> Path:
    """Return the path of the user's writable tuning database."""
    override = os.environ.get("AUTONORM_DB")
    if override:
        return Path(override)
    return cache_dir() / "autonorm.db"


def kernel_cache_dir() -> Path:
    """Return the directory of the on-disk cache of compiled kernels."""
    return cache_dir() / "kernels"


def studies_dir() -> Path:
    """Return the directory holding the default Optuna journal files."""
    return cache_dir() / "studies"
