"""Export a tuned kernel as standalone CUDA C++: its source, its family's files and a manifest.

A LayerNorm or RMSNorm export, forward or backward, is ``<basename>.cu`` (the kernel, then a
host launcher), ``<basename>.h`` and ``<basename>.json``; it needs only the CUDA runtime, no
Python or autonorm.
:mod:`.files` renders and writes the files of a given configuration; :mod:`.tuned` picks the
configuration from the tuning databases (the winner :mod:`autonorm.lookup` picks, or the
family's default).
"""

from autonorm.export.files import (
    MANIFEST_FORMAT,
    ExportedKernel,
    default_basename,
    export_kernel,
    render_export,
    write_export,
)
from autonorm.export.tuned import (
    DefaultConfigWarning,
    TunedChoice,
    choose_tuned,
    export_from_db,
    export_tuned,
    find_tuned,
)

__all__ = [
    "MANIFEST_FORMAT",
    "DefaultConfigWarning",
    "ExportedKernel",
    "TunedChoice",
    "choose_tuned",
    "default_basename",
    "export_from_db",
    "export_kernel",
    "export_tuned",
    "find_tuned",
    "render_export",
    "write_export",
]
