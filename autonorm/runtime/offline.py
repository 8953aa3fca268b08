"""Compile rendered kernels offline with nvcc, on a machine without a GPU.

:func:`compile_offline` compiles many kernels for a named arch in one nvcc run a core and reports
each one's registers, shared memory and spills from ``-Xptxas -v`` (:func:`parse_ptxas`): the sweeps
behind the register rules (docs/registers.md) and the CPU tests that every valid configuration
compiles without spills. Run-time compilation (NVRTC) is :mod:`autonorm.runtime.compiler`'s.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from autonorm.errors import CompileError

if TYPE_CHECKING:
    from autonorm.codegen.kernel import RenderedKernel


@dataclass(frozen=True)
class PtxasReport:
    """Resources of one compiled kernel, from ``ptxas -v``."""

    name: str
    registers: int
    static_smem: int
    stack_frame: int
    spill_stores: int
    spill_loads: int

    @property
    def spills(self) -> bool:
        """True when the kernel uses local memory for spills or a stack frame."""
        return bool(self.spill_stores or self.spill_loads or self.stack_frame)


_FUNC_RE = re.compile(r"Function properties for (\w+)")

_FRAME_RE = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)

_COMPILING_RE = re.compile(r"Compiling entry function '(\w+)'")

_USED_RE = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


# nvcc runs at once at most: each holds a translation unit's front end in memory.
MAX_JOBS = 8


def nvcc_path() -> str | None:
    """Return the nvcc executable, or None if it is not installed."""
    return shutil.which("nvcc")


def parse_ptxas(log: str) -> dict[str, PtxasReport]:
    """Parse ``nvcc -Xptxas -v`` output into one report per kernel."""
    frames: dict[str, tuple[int, int, int]] = {}
    used: dict[str, tuple[int, int]] = {}
    current_props = current_entry = None
    for line in log.splitlines():
        if m := _FUNC_RE.search(line):
            current_props = m.group(1)
        elif (m := _FRAME_RE.search(line)) and current_props:
            frames[current_props] = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
        if m := _COMPILING_RE.search(line):
            current_entry = m.group(1)
        elif (m := _USED_RE.search(line)) and current_entry:
            used[current_entry] = (int(m.group(1)), int(m.group(2) or 0))
    reports = {}
    for name, (regs, smem) in used.items():
        frame, st, ld = frames.get(name, (0, 0, 0))
        reports[name] = PtxasReport(name, regs, smem, frame, st, ld)
    return reports


def compile_offline(
    kernels: Sequence[RenderedKernel], arch: str = "sm_90", *, workdir: Path | None = None
) -> dict[str, PtxasReport]:
    """Compile ``kernels`` with nvcc for ``arch``; no GPU needed.

    The sources are concatenated into one translation unit a core (every kernel has a unique
    name and its helpers live in a namespace of their own): ptxas runs on one core, so a
    sweep costs one nvcc run per core, side by side.

    Raises:
        CompileError: nvcc is missing or rejected the source (its log is in the message).

    """
    nvcc = nvcc_path()
    if nvcc is None:
        raise CompileError("nvcc not found on PATH: offline compilation needs the CUDA toolkit")
    jobs = max(1, min(len(kernels), _cores(), MAX_JOBS))
    # Every job takes every jobs-th kernel, so the large and the small ones spread evenly.
    chunks = [kernels[i::jobs] for i in range(jobs)]
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        with ThreadPoolExecutor(jobs) as pool:
            logs = list(pool.map(lambda i: _run_nvcc(nvcc, arch, chunks[i], Path(tmp) / str(i)),
                                 range(jobs)))
    reports: dict[str, PtxasReport] = {}
    for log in logs:
        reports.update(parse_ptxas(log))
    missing = [k.name for k in kernels if k.name not in reports]
    if missing:
        raise CompileError(f"ptxas reported nothing for {missing[:3]}")
    return reports


def _cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _run_nvcc(nvcc: str, arch: str, kernels: Sequence[RenderedKernel], folder: Path) -> str:
    """Compile ``kernels`` as one translation unit in ``folder``; return ptxas's log.

    Raises:
        CompileError: nvcc rejected the source.
    """
    folder.mkdir()
    src = folder / "sweep.cu"
    src.write_text("\n".join(k.source for k in kernels))
    cmd = [
        nvcc, f"-arch={arch}", "-std=c++17", "-cubin", "-Xptxas", "-v",
        "-o", str(folder / "sweep.cubin"), str(src),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise CompileError(f"nvcc failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc.stdout + proc.stderr
