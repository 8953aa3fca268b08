"""The launch ABI: how a family's kernel parameters are laid out for ``cuLaunchKernel``.

A kernel's parameters are plain values (device pointers, integers, floats), and each family
states its list once, as a :class:`KernelABI` (``Family.kernel_abi``). The runtime never names a
parameter: a caller passes :meth:`~autonorm.runtime.compiler.CompiledKernel.launch` a tuple of
the values in the kernel's order, the runtime reads the row count at ``rows_index`` to size the
grid, and where ``workspace`` is set it appends the workspace pointer (the zeroed tile counter
of a dynamic schedule, :mod:`autonorm.runtime.workspace`) as the kernel's last parameter.

The list is a ``struct`` format so that the launcher packs every value with one
``struct.pack_into`` into a buffer it made in advance: per-value stores through ctypes cost
more than the whole pack, and a call whose kernel is cached has only a few microseconds of host
time to spend (:class:`autonorm.runtime.driver._DriverLauncher` gives the figures).

Pure logic: no CuPy, no GPU.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass

# struct codes a parameter may have, with their size (their alignment too) and NumPy type.
_CODES: dict[str, tuple[int, str]] = {
    "Q": (8, "uint64"),  # a device pointer (or any 64-bit unsigned value)
    "q": (8, "int64"),
    "I": (4, "uint32"),
    "i": (4, "int32"),
    "f": (4, "float32"),
    "d": (8, "float64"),
}

_ROW_CODES = frozenset("QqIi")

# The workspace pointer's code: always the last slot of the packed buffer (see KernelABI.layout).
_WORKSPACE = "Q"


@dataclass(frozen=True)
class KernelABI:
    """The parameter list of a kernel, as the launcher packs it.

    Attributes:
        params: one ``struct`` code per parameter the caller passes, in the kernel's order:
            ``Q`` a pointer (or uint64), ``q`` int64, ``I`` uint32, ``i`` int32, ``f`` float,
            ``d`` double.
        rows_index: the position in ``params`` of the row count, from which the grid follows.
        workspace: the kernel takes one more parameter after ``params``, a pointer to its
            workspace (a tile counter), which the runtime supplies.
    """

    params: str
    rows_index: int
    workspace: bool = False

    def __post_init__(self) -> None:
        unknown = sorted(set(self.params) - set(_CODES))
        if not self.params or unknown:
            raise ValueError(f"parameter codes must be among {''.join(_CODES)}, got "
                             f"{self.params!r}")
        if not 0 <= self.rows_index < len(self.params):
            raise ValueError(f"rows_index {self.rows_index} is not a parameter of {self.params!r}")
        if self.params[self.rows_index] not in _ROW_CODES:
            code = self.params[self.rows_index]
            raise ValueError(f"the row count must be an integer, got code {code!r}")

    @property
    def count(self) -> int:
        """The number of values a caller passes (the workspace pointer not counted)."""
        return len(self.params)

    @property
    def packer(self) -> struct.Struct:
        """The ``struct`` that packs the values, then the workspace pointer, in one call."""
        return _layout(self.params, self.workspace)[0]

    @property
    def offsets(self) -> tuple[int, ...]:
        """Byte offset of each parameter the kernel reads (the workspace's last, if it has one).

        The buffer always ends with a workspace slot, so one pack serves every ABI: a kernel
        without a workspace has no pointer to that slot, and the driver never reads it.
        """
        return _layout(self.params, self.workspace)[1]

    @property
    def numpy_types(self) -> tuple[str, ...]:
        """The NumPy type of each value the kernel reads (CuPy's launch path takes these)."""
        codes = self.params + (_WORKSPACE if self.workspace else "")
        return tuple(_CODES[c][1] for c in codes)


@functools.cache
def _layout(params: str, workspace: bool) -> tuple[struct.Struct, tuple[int, ...]]:
    """The packing struct (values at natural alignment, then the workspace slot) and offsets."""
    fmt, offsets, at = "=", [], 0
    for code in params + _WORKSPACE:
        size = _CODES[code][0]
        pad = -at % size
        fmt += f"{pad}x{code}" if pad else code
        at += pad
        offsets.append(at)
        at += size
    if not workspace:
        offsets.pop()
    return struct.Struct(fmt), tuple(offsets)


# The parameter list of a launcher made without one (``driver._DriverLauncher``): four
# pointers, a row count, a float, then the workspace, as the first family's kernels take them
# (x, weight, bias, y, rows, eps, tile counter). Every family states its own list.
DEFAULT_ABI = KernelABI("QQQQif", rows_index=4, workspace=True)
