"""The device properties that decide which kernels are valid, and how they launch.

:class:`DeviceLimits` is what a family's validity rules and launch plans read; :data:`H200` is
the device a machine without a GPU renders and checks kernels for.
:meth:`autonorm.runtime.device.DeviceInfo.limits` gives a real GPU's.

Pure logic: no CuPy, no GPU.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# The blocks a portable thread-block cluster may have, and the larger (non-portable) clusters
# that devices of a compute capability launch.
PORTABLE_CLUSTER_BLOCKS = 8
NON_PORTABLE_CLUSTER_BLOCKS = {90: 16}


@dataclass(frozen=True)
class DeviceLimits:
    """The device properties that decide validity and launch shapes.

    ``cluster_limit`` caps the blocks of a cluster below what the compute capability allows
    (0: no cap), for a device that does not place the larger clusters (:meth:`portable`).
    """

    name: str = "NVIDIA H200"
    cc: int = 90
    sm_count: int = 132
    max_smem_optin: int = 232448
    regs_per_sm: int = 65536
    max_threads_per_sm: int = 2048
    l2_bytes: int = 62914560
    smem_per_sm: int = 233472
    cluster_limit: int = 0

    @property
    def max_cluster_blocks(self) -> int:
        """Blocks a thread-block cluster may have: 16 (non-portable) on Hopper, else 8.

        Eight is the portable size every device with clusters launches; Hopper (H100, H200)
        launches 16 where the kernel allows non-portable sizes. Other devices keep the portable
        size until one is measured. ``cluster_limit``, where set, caps it.
        """
        blocks = NON_PORTABLE_CLUSTER_BLOCKS.get(self.cc, PORTABLE_CLUSTER_BLOCKS)
        return min(blocks, self.cluster_limit) if self.cluster_limit else blocks

    def portable(self) -> DeviceLimits:
        """These limits with clusters of at most the portable size."""
        return dataclasses.replace(self, cluster_limit=PORTABLE_CLUSTER_BLOCKS)

    @property
    def arch(self) -> str:
        """The NVRTC/nvcc architecture name, e.g. ``sm_90``."""
        return f"sm_{self.cc}"


H200 = DeviceLimits()
