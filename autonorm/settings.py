"""Every path and environment variable autonorm reads, in one place.

Environment variables:
    AUTONORM_DB: path of the user's tuning database (default: per-user cache dir); where it
        cannot be written, its winners are read and tuning refuses to start.
    AUTONORM_CACHE_DIR: root of autonorm's per-user cache (compiled kernels, studies).
    AUTONORM_SHIPPED_DB: override the path of the read-only shipped database.
    AUTONORM_NO_SHIPPED_DB: set to 1 to ignore the shipped database (tests, A/B runs).
    AUTONORM_NO_KEEP_X: set to 1 to dispatch tuned kernels without keep_x's L2 hint (for a
        program whose next kernel re-reads tens of MB from L2; docs/l2-hints.md).
    AUTONORM_TUNE_ON_FIRST_USE: set to 1 to tune, at its first call, a shape that no database
        holds a winner for at its rows bucket on this GPU, and store the winner in the user's
        database (docs/tuning.md); ``autonorm.tune_on_first_use`` sets it from Python.
    AUTONORM_FIRST_USE_BUDGET_S: seconds such a tuning may take (default 15, bounded to
        1-300).

The yes-or-no settings (the three "set to 1" above) read 1, true, yes and on as yes and 0, false,
no and off as no, in any case; unset or empty is no. Any other value is ignored with a warning
(:class:`autonorm.errors.BadSettingWarning`), once a process.

Any other ``AUTONORM_*`` name (but the test suite's ``AUTONORM_TEST_*``) is no setting: the
command line and dispatch warn of it once, with the setting most like it.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent

# Every environment variable above, by name; AUTONORM_TEST_* are the test suite's own.
VARIABLES = (
    "AUTONORM_DB", "AUTONORM_CACHE_DIR", "AUTONORM_SHIPPED_DB", "AUTONORM_NO_SHIPPED_DB",
    "AUTONORM_NO_KEEP_X", "AUTONORM_TUNE_ON_FIRST_USE", "AUTONORM_FIRST_USE_BUDGET_S",
)
TEST_PREFIX = "AUTONORM_TEST_"

# The yes-or-no settings, and the values they read (lower-cased, stripped). Anything but "" or
# "0" once read as yes, so AUTONORM_TUNE_ON_FIRST_USE=false turned tuning on.
FLAGS = ("AUTONORM_NO_SHIPPED_DB", "AUTONORM_NO_KEEP_X", "AUTONORM_TUNE_ON_FIRST_USE")
YES = ("1", "true", "yes", "on")
NO = ("", "0", "false", "no", "off")

# Seconds a tuning on first use may take, unless AUTONORM_FIRST_USE_BUDGET_S says otherwise.
FIRST_USE_BUDGET_S = 15.0

# The budgets allowed: under a second no candidate is measured; past minutes it is no longer a
# first call but a tuning run, which `autonorm tune` does better (it resumes, shows progress).
FIRST_USE_BUDGET_BOUNDS_S = (1.0, 300.0)


def flag(name: str) -> bool:
    """Return whether the yes-or-no setting ``name`` (one of :data:`FLAGS`) says yes.

    A value that is neither yes nor no is ignored (no, the default), with a warning once a
    process for each such value.
    """
    value = os.environ.get(name, "")
    said = _reads(value)
    if said is not None:
        return said
    if (name, value) not in _FLAGS_WARNED:
        _FLAGS_WARNED.add((name, value))
        import warnings

        from autonorm.errors import BadSettingWarning

        warnings.warn(_flag_message(name, value), BadSettingWarning, stacklevel=3)
    return False


_FLAGS_WARNED: set[tuple[str, str]] = set()


def _reads(value: str) -> bool | None:
    """What a yes-or-no setting's value says: True, False, or None where it is neither."""
    word = value.strip().lower()
    return True if word in YES else False if word in NO else None


def _flag_message(name: str, value: str) -> str:
    return (f"{name}={value!r} is neither yes ({', '.join(YES)}) nor no "
            f"({', '.join(v for v in NO if v)}): it is ignored")


def flag_messages() -> list[str]:
    """Return a line for each yes-or-no setting set to a value it cannot read (ignored)."""
    values = ((name, os.environ.get(name, "")) for name in FLAGS)
    return [_flag_message(name, value) for name, value in values if _reads(value) is None]


def shipped_db_path() -> Path | None:
    """Return the read-only tuning database shipped with autonorm, or None if disabled."""
    if flag("AUTONORM_NO_SHIPPED_DB"):
        return None
    override = os.environ.get("AUTONORM_SHIPPED_DB")
    if override:
        return Path(override)
    return _PACKAGE_DIR / "tuning_db" / "autonorm.db"


def keep_x_allowed() -> bool:
    """Whether dispatch may launch kernels that hint x to stay in L2 (``AUTONORM_NO_KEEP_X``).

    The hint makes LayerNorm 1-5% faster, but L2 then holds x's lines ahead of others: a kernel
    that re-reads 16-40 MB from L2 right after it ran 0.2-3.6 us slower on the H200.
    """
    return not flag("AUTONORM_NO_KEEP_X")


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


def tune_on_first_use() -> bool:
    """Whether ``AUTONORM_TUNE_ON_FIRST_USE`` asks to tune unknown shapes at their first call."""
    return flag("AUTONORM_TUNE_ON_FIRST_USE")


def first_use_budget_s() -> float:
    """Return the seconds a tuning on first use may take (``AUTONORM_FIRST_USE_BUDGET_S``).

    A value outside ``FIRST_USE_BUDGET_BOUNDS_S`` is moved to the nearer bound.

    Raises:
        ValueError: the variable is set to something that is not a finite number.

    """
    text = os.environ.get("AUTONORM_FIRST_USE_BUDGET_S", "").strip()
    if not text:
        return FIRST_USE_BUDGET_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ValueError(f"AUTONORM_FIRST_USE_BUDGET_S must be a number of seconds, got {text!r}")
    low, high = FIRST_USE_BUDGET_BOUNDS_S
    return min(max(value, low), high)


def first_use_lock_dir() -> Path:
    """Return the directory of the lock files that let one process tune a shape for all."""
    return cache_dir() / "first_use"


def variables_set() -> tuple[dict[str, str], list[str]]:
    """Return the autonorm variables set in the environment, and other AUTONORM_* names set.

    The other names are none of :data:`VARIABLES` nor the test suite's: a misspelt setting,
    which autonorm would ignore silently.
    """
    given = {name: value for name, value in os.environ.items() if name.startswith("AUTONORM_")}
    known = {name: given[name] for name in VARIABLES if name in given}
    unknown = sorted(name for name in given
                     if name not in known and not name.startswith(TEST_PREFIX))
    return known, unknown


_WARNED = False


def unknown_variable_messages() -> list[str]:
    """Return a line for each ``AUTONORM_*`` name set that is no setting (ignored).

    Each names the setting most like it, where one is.
    """
    import difflib

    messages = []
    for name in variables_set()[1]:
        close = difflib.get_close_matches(name, VARIABLES, n=1)
        hint = f"did you mean {close[0]}?" if close else f"they are {', '.join(VARIABLES)}"
        messages.append(f"{name} is no autonorm setting and is ignored; {hint}")
    return messages


def warn_unknown_variables() -> None:
    """Warn, once per process, of each ``AUTONORM_*`` name set that is no setting.

    A misspelt setting is otherwise ignored without a word (``AUTONORM_TUNE_ON_FIRSTUSE=1``
    tunes nothing).
    """
    global _WARNED
    if _WARNED:
        return
    _WARNED = True
    import warnings

    from autonorm.errors import UnknownSettingWarning

    for message in unknown_variable_messages():
        warnings.warn(message, UnknownSettingWarning, stacklevel=3)
