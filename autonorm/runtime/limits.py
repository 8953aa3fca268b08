"""The search space: problems, kernel configurations, validity rules and enumeration.

A :class:`Problem` is what the user asks for (hidden size, dtype, affine flags). A
:class:`KernelConfig` is one point of the template family. :func:`check` says why a
configuration cannot run a problem on a device, before anything is compiled;
:func:`enumerate_space` lists every valid configuration and :func:`default_config` picks a sound
one for any hidden size without tuning.

Pure logic: no CuPy, no GPU.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceLimits:
    """The device properties that decide validity and launch shapes."""

    name: str = "NVIDIA H200"
    cc: int = 90
    sm_count: int = 132
    max_smem_optin: int = 232448
    regs_per_sm: int = 65536
    max_threads_per_sm: int = 2048
    l2_bytes: int = 62914560
    smem_per_sm: int = 233472

    @property
    def arch(self) -> str:
        """The NVRTC/nvcc architecture name, e.g. ``sm_90``."""
        return f"sm_{self.cc}"

H200 = DeviceLimits()
