"""Every path and environment variable autonorm reads, in one place.

Environment variables:
    AUTONORM_DB: path of the user's tuning database (default: per-user cache dir); where it
        cannot be written, its winners are read and tuning refuses to start.
    AUTONORM_CACHE_DIR: root of autonorm's per-user cache (compiled kernels, studies).
    AUTONORM_SHIPPED_DB: override the path of the read-only shipped database.
    AUTONORM_NO_SHIPPED_DB: set to 1 to ignore the shipped database (tests, A/B runs).
    AUTONORM_NO_KEEP_X: set to 1 to dispatch tuned kernels without keep_x's L2 hint (for a
        program whose next kernel re-reads tens of MB from L2; docs/l2-hints.md).
"""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


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


def keep_x_allowed() -> bool:
    """Whether dispatch may launch kernels that hint x to stay in L2 (``AUTONORM_NO_KEEP_X``).

    The hint makes LayerNorm 1-5% faster, but L2 then holds x's lines ahead of others: a kernel
    that re-reads 16-40 MB from L2 right after it ran 0.2-3.6 us slower on the H200.
    """
    return os.environ.get("AUTONORM_NO_KEEP_X", "") in ("", "0")


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
