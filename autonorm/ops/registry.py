"""The kernel families autonorm knows, by op name.

The built-in families register themselves on first use; a family defined elsewhere (a test, a
plug-in) calls :func:`register` once and is then served by every generic layer.
"""

from __future__ import annotations

import importlib
import threading

from autonorm.ops.base import Family

# Built-in families: op name -> "module" whose FAMILY attribute is the family, or
# "module:NAME" whose NAME attribute is.
BUILTIN: dict[str, str] = {
    "layer_norm": "autonorm.ops.layer_norm.family",
    "rms_norm": "autonorm.ops.rms_norm.family",
    "layer_norm_backward": "autonorm.ops.norm_backward.family:LAYER_NORM",
    "rms_norm_backward": "autonorm.ops.norm_backward.family:RMS_NORM",
}

_FAMILIES: dict[str, Family] = {}
_LOCK = threading.Lock()


def register(family: Family) -> Family:
    """Make ``family`` known under ``family.op`` (replacing a family of the same op)."""
    with _LOCK:
        _FAMILIES[family.op] = family
    return family


def unregister(op: str) -> None:
    """Forget the family of ``op`` (a built-in one comes back on its next use)."""
    with _LOCK:
        _FAMILIES.pop(op, None)


def get(op: str) -> Family:
    """Return the family of ``op``.

    Raises:
        KeyError: no family has that op name (the message lists the known ones).
    """
    family = _FAMILIES.get(op)
    if family is not None:
        return family
    module = BUILTIN.get(op)
    if module is None:
        raise KeyError(f"unknown op {op!r}: known ops are {', '.join(known())}")
    path, _, name = module.partition(":")
    return register(getattr(importlib.import_module(path), name or "FAMILY"))


def known() -> list[str]:
    """Return the op names of every family, built-in and registered, sorted."""
    return sorted(set(BUILTIN) | set(_FAMILIES))


def family_of(problem: object) -> Family:
    """Return the family of a problem (by its ``op``)."""
    return get(type(problem).op)  # type: ignore[attr-defined]
