"""The device properties that decide which kernels are valid, and how they launch.

:class:`DeviceLimits` is what a family's validity rules and launch plans read; :data:`H200` is
the device a machine without a GPU renders and checks kernels for.
:meth:`autonorm.runtime.device.DeviceInfo.limits` gives a real GPU's.

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
