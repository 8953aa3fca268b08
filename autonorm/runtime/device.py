"""What GPU we run on: its properties, as a fingerprint for the tuning database.

:class:`DeviceInfo` is pure data. :func:`query_device` imports CuPy lazily, so importing this
module works on a machine without a GPU.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from autonorm.runtime.limits import DeviceLimits


class NoGPUError(RuntimeError):
    """No usable CUDA GPU (or no CuPy) on this machine."""


@dataclass(frozen=True)
class DeviceInfo:
    """Properties of one GPU that decide which kernel is fastest on it."""

    name: str
    cc: int  # compute capability as major*10+minor, e.g. 90
    sm_count: int
    l2_bytes: int
    smem_optin: int  # opt-in shared memory per block, bytes
    mem_bus_bits: int
    mem_clock_khz: int
    regs_per_sm: int = 65536
    max_threads_per_sm: int = 2048
    smem_per_sm: int = 233472

    @property
    def fingerprint(self) -> str:
        """A stable identifier of the GPU model and its configuration (DB key)."""
        return (
            f"{self.name}|sm{self.cc}|{self.sm_count}sm|l2={self.l2_bytes}"
            f"|bus={self.mem_bus_bits}|memclk={self.mem_clock_khz}"
        )

    @property
    def arch(self) -> str:
        """The NVRTC architecture name, e.g. ``sm_90``."""
        return f"sm_{self.cc}"

    @property
    def peak_dram_gbps(self) -> float:
        """Theoretical DRAM bandwidth in GB/s (double data rate)."""
        return 2.0 * self.mem_clock_khz * 1e3 * (self.mem_bus_bits / 8) / 1e9

    def limits(self) -> DeviceLimits:
        """Return the limits that a family's validity rules and launch plans read."""
        return DeviceLimits(
            name=self.name,
            cc=self.cc,
            sm_count=self.sm_count,
            max_smem_optin=self.smem_optin,
            regs_per_sm=self.regs_per_sm,
            max_threads_per_sm=self.max_threads_per_sm,
            l2_bytes=self.l2_bytes,
            smem_per_sm=self.smem_per_sm,
        )


def import_cupy():  # noqa: ANN201 - returns the cupy module
    """Import CuPy, or raise :class:`NoGPUError` with an actionable message."""
    try:
        import cupy
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise NoGPUError(
            "CuPy is not installed: install autonorm with the extra for your CUDA version, "
            "e.g. pip install 'autonorm[cuda13]'"
        ) from exc
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - CuPy raises several CUDA error types
        raise NoGPUError(f"no CUDA GPU is usable here: {exc}") from exc
    if count < 1:
        raise NoGPUError("no CUDA GPU found on this machine")
    return cupy


def gpu_available() -> bool:
    """Return True if CuPy imports and sees at least one GPU."""
    try:
        import_cupy()
    except NoGPUError:
        return False
    return True


@functools.cache
def query_device(device_id: int | None = None) -> DeviceInfo:
    """Read the properties of a GPU (the current one by default).

    Raises:
        NoGPUError: there is no usable GPU.

    """
    cupy = import_cupy()
    if device_id is None:
        device_id = cupy.cuda.runtime.getDevice()
    props = cupy.cuda.runtime.getDeviceProperties(device_id)
    name = props["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    return DeviceInfo(
        name=name,
        cc=int(props["major"]) * 10 + int(props["minor"]),
        sm_count=int(props["multiProcessorCount"]),
        l2_bytes=int(props["l2CacheSize"]),
        smem_optin=int(props["sharedMemPerBlockOptin"]),
        mem_bus_bits=int(props.get("memoryBusWidth", 0)),
        mem_clock_khz=int(props.get("memoryClockRate", 0)),
        regs_per_sm=int(props.get("regsPerMultiprocessor", 65536)),
        max_threads_per_sm=int(props.get("maxThreadsPerMultiProcessor", 2048)),
        smem_per_sm=int(props.get("sharedMemPerMultiprocessor", 233472)),
    )
