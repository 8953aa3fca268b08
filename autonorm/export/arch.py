"""The GPU kinds an export can be made for, by architecture (``sm_75`` to ``sm_120``).

An export for another GPU than the one at hand takes that kind's winners where a tuning
database has them (its devices table records each device's compute capability), else the
family's default configuration for the kind's limits: those of a recorded device of the kind,
or else the datasheet values below. Pure data: no GPU, no CuPy.
"""

from __future__ import annotations

import re

from autonorm.runtime.limits import H200, DeviceLimits

# Datasheet values of one GPU of each kind (NVIDIA's datasheets and the CUDA programming guide's
# table of compute capabilities; not measured here): SMs, shared memory a block may opt in to and
# an SM holds, resident threads an SM, L2. Registers (64K per SM) are those of every kind here.
# A kind's other parts differ in SMs and L2 only; a recorded device of the kind overrides these.
T4 = DeviceLimits(
    name="Tesla T4", cc=75, sm_count=40, max_smem_optin=64 * 1024, l2_bytes=4 * 1024**2,
    smem_per_sm=64 * 1024, max_threads_per_sm=1024,
)

A100 = DeviceLimits(
    name="NVIDIA A100", cc=80, sm_count=108, max_smem_optin=163 * 1024, l2_bytes=40 * 1024**2,
    smem_per_sm=164 * 1024,
)

A10 = DeviceLimits(
    name="NVIDIA A10", cc=86, sm_count=72, max_smem_optin=99 * 1024, l2_bytes=6 * 1024**2,
    smem_per_sm=100 * 1024, max_threads_per_sm=1536,
)

L40S = DeviceLimits(
    name="NVIDIA L40S", cc=89, sm_count=142, max_smem_optin=99 * 1024, l2_bytes=96 * 1024**2,
    smem_per_sm=100 * 1024, max_threads_per_sm=1536,
)

B200 = DeviceLimits(
    name="NVIDIA B200", cc=100, sm_count=148, max_smem_optin=227 * 1024, l2_bytes=126 * 1024**2,
    smem_per_sm=228 * 1024,
)

RTX5090 = DeviceLimits(
    name="NVIDIA GeForce RTX 5090", cc=120, sm_count=170, max_smem_optin=99 * 1024,
    l2_bytes=96 * 1024**2, smem_per_sm=100 * 1024, max_threads_per_sm=1536,
)

# The limits a default configuration is rendered for, by compute capability (sm_90: the H200,
# the device autonorm renders for without a GPU).
KNOWN: dict[int, DeviceLimits] = {
    75: T4, 80: A100, 86: A10, 89: L40S, 90: H200, 100: B200, 120: RTX5090,
}

_ARCH = re.compile(r"(?:sm_?|compute_)?(\d{2,3})[a-z]?|(\d{1,2})\.(\d)")


def parse_arch(text: str) -> int:
    """Return the compute capability named by ``sm_90``, ``sm90``, ``90`` or ``9.0``.

    Raises:
        ValueError: ``text`` names no architecture.

    """
    match = _ARCH.fullmatch(text.strip().lower())
    if match is None:
        raise ValueError(f"not a GPU architecture: {text!r} (expected e.g. sm_80, sm_90, sm_100)")
    if match.group(1):
        return int(match.group(1))
    return int(match.group(2)) * 10 + int(match.group(3))


def arch_name(cc: int) -> str:
    """Return the nvcc architecture of a compute capability, e.g. ``sm_90``."""
    return f"sm_{cc}"


def describe_cc(cc: int) -> str:
    """Return a compute capability as NVIDIA writes it, e.g. ``9.0``."""
    return f"{cc // 10}.{cc % 10}"
