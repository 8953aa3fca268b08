"""autonorm's lookup modes in untuned.py: switched in this process, and each pick checked."""

from __future__ import annotations

import os
from pathlib import Path


def check_mode(mode: str, source: str) -> str | None:
    """Say why a lookup's source cannot be ``mode``'s pick (a mode that did not take), or None."""
    if mode == "tuned":
        ok = source.startswith("user")
    else:
        ok = not source.startswith("user") and not (mode == "no-shipped" and "shipped" in source)
    return None if ok else f"dispatch picked a {source!r} kernel in mode {mode}"


class Modes:
    """Switches autonorm's lookup between the modes, in this process."""

    def __init__(self, work: Path) -> None:
        self.no_user_db = work / "no-user.db"  # never created: no user database
        self.tuned_db = work / "tuned.db"

    def enter(self, mode: str) -> None:
        from autonorm import dispatch
        from autonorm.torch import clear_kernel_cache

        os.environ["AUTONORM_DB"] = str(self.tuned_db if mode == "tuned" else self.no_user_db)
        if mode == "no-shipped":
            os.environ["AUTONORM_NO_SHIPPED_DB"] = "1"
        else:
            os.environ.pop("AUTONORM_NO_SHIPPED_DB", None)
        dispatch.clear_cache()  # both caches hold kernels picked under the previous mode
        clear_kernel_cache()


def turn_off_first_use_tuning() -> None:
    """Untuned must stay untuned: no lookup may tune on the spot (docs/tuning.md)."""
    os.environ.pop("AUTONORM_TUNE_ON_FIRST_USE", None)
    import autonorm

    switch = getattr(autonorm, "tune_on_first_use", None)
    if switch is not None:
        switch(False)
