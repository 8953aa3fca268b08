"""The exceptions autonorm raises, so callers can catch them by type."""

from __future__ import annotations


class AutonormError(Exception):
    """Base class of every error autonorm raises on purpose."""


class InputError(AutonormError, ValueError):
    """An argument to :func:`autonorm.layer_norm` is unusable (dtype, shape, device, eps)."""


class UnsupportedDtypeError(InputError, TypeError):
    """The dtype is not float32, float16 or bfloat16 (or dtypes of x, weight, bias differ)."""


class ShapeError(InputError):
    """A shape does not fit: wrong number of dimensions, or weight/bias size != hidden."""


class DeviceMismatchError(InputError):
    """Arrays live on different devices (another GPU, or the host and the GPU)."""


class CompileError(AutonormError):
    """A rendered kernel failed to compile (NVRTC or nvcc)."""


class VerificationError(AutonormError):
    """A kernel's output disagrees with the float64 reference beyond tolerance."""


class LaunchError(AutonormError):
    """A kernel launch failed or faulted."""


class DatabaseError(AutonormError):
    """The tuning database cannot be used: corrupt, read-only, locked or of a newer schema."""


class CorruptDatabaseWarning(UserWarning):
    """A corrupt tuning database was moved aside and replaced by a fresh, empty one."""


class ConfigError(AutonormError, ValueError):
    """A configuration cannot run a problem, or no configuration can (unsupported hidden size)."""


class ReadOnlyDatabaseWarning(UserWarning):
    """The user's tuning database cannot be written: its winners are read, no result is stored."""


class UnknownSettingWarning(UserWarning):
    """An ``AUTONORM_*`` environment variable is set that is no setting: it is ignored."""


class BadSettingWarning(UserWarning):
    """An autonorm setting holds a value it cannot read: it is ignored, the default applies."""
