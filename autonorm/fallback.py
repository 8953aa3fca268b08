"""Defaults that do not spill: what runs where a family's default spills on the GPU at hand.

A family's default rule estimates each configuration's registers from a fit to one compiler
and one architecture (nvcc 13.0, sm_90), and the fit runs short in places. Compiled for their
own architectures, the defaults of an A100, an L40S or a T4 spill in 16-bit LayerNorm backward
at 4096-16384 elements (512-thread kernels holding the row in registers, 24-172 bytes; sm_90's
ptxas spills them too, but an H200's defaults there are bulk kernels); a B200's spill in 16-bit
LayerNorm forward at 512-2048 (the smem kernels capped at 64 registers) and 16384-65536 (bulk
kernels at 128 registers), which sm_90's ptxas fits; and an H200's own after the add at bf16
32768 and 65536 (docs/families.md). A kernel that spills reads and writes local memory for
every row; the tuner times it like any other, but dispatch of an untuned shape has no timing to
go by.

So where the default's kernel spills, leaner picks are tried in turn. First the family's own
(its optional ``leaner`` member: the forward norms lift a register cap, ``max_regs``, give
a bulk kernel more stages, so that fewer blocks share an SM's registers, or split its row over
a larger cluster, so that each thread holds fewer vectors). Then the default
rule asked again for a register file of :data:`LEAN_REGISTER_SHARES` of the device's: its
estimates then keep a margin, and it picks a kernel that fits it (fewer threads an SM, each
with more registers, or no prefetched row). A pick must keep the default's row cache: one that
reads the row again instead of holding it ran several times slower than the spilling default.
Each pick is checked on the real device's limits and rendered for them; the first that does
not spill runs. Dispatch asks with the compiled kernel's local memory
(:func:`autonorm.dispatch.get_kernel`), an export with nvcc's report where nvcc is installed
(:mod:`autonorm.export.tuned`), the offline tests with ptxas's (``tests/test_kinds_compile.py``).

Pure logic: no CuPy, no GPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from autonorm.errors import ConfigError
from autonorm.ops.registry import family_of

if TYPE_CHECKING:
    from autonorm.ops.base import Config, Problem
    from autonorm.runtime.limits import DeviceLimits

__all__ = ["LEAN_REGISTER_SHARES", "leaner_defaults", "leaner_offline"]

# A pick keeps the default's row cache (``cache``). On the H200 the spilling backward defaults
# of 16-bit odd rows (8-48 bytes of local memory, the row in registers) ran 2.4x-4.5x faster
# than the spill-free picks that read the row again (bf16 9001: 248 us against 590; 7001: 204
# against 786, RMSNorm 159 against 709), while a pick in the same place gained (fp32 7001 after
# the add without its prefetched row: 341 us against 382) (docs/families.md).
#
# The shares of the register file the rule is asked for in turn. Three quarters fixed every
# default that spilled in 16-bit LayerNorm backward on sm_75-sm_89 (nvcc 13.0); half is the
# next step where it did not.
LEAN_REGISTER_SHARES = (0.75, 0.5)


def leaner_defaults(
    problem: Problem, limits: DeviceLimits, rows: int | None, first: Config
) -> Iterator[Config]:
    """Yield other configurations of ``problem`` to run where ``first`` spills, in order.

    Args:
        problem: what runs.
        limits: the device it runs on.
        rows: the row count the default is for (None: the family's default of many rows).
        first: the default that spilled; it and any repeat are left out.

    Yields:
        Each new configuration, the family's ``leaner`` forms and then the default rule's for
        :data:`LEAN_REGISTER_SHARES` of ``limits``'s registers, that keeps ``first``'s row
        cache and that the family's rules accept on ``limits`` themselves.

    """
    family = family_of(problem)
    hook = getattr(family, "leaner", None)
    picks = [lambda form=form: form for form in (hook(first, problem, limits) if hook else ())]
    for share in LEAN_REGISTER_SHARES:
        tighter = dataclasses.replace(limits, regs_per_sm=int(limits.regs_per_sm * share))
        picks.append(lambda tighter=tighter: family.default(problem, tighter, rows))
    seen = {first}
    for pick in picks:
        try:
            config = pick()
        except ConfigError:
            continue  # nothing fits the smaller file: the next share is smaller still
        if config in seen or family.check(config, problem, limits):
            continue
        if getattr(config, "cache", None) != getattr(first, "cache", None):
            continue  # another place for the row: a slower kernel, not a leaner one
        seen.add(config)
        yield config


def leaner_offline(
    spilling: Sequence[tuple[Problem, int | None, Config]], limits: DeviceLimits
) -> list[Config | None]:
    """Return, for each spilling (problem, rows, default), the pick that runs in its place.

    Where dispatch asks the GPU's compiler, this asks nvcc for ``limits``'s architecture, every
    pick of every default in one batch: the first of :func:`leaner_defaults` that compiles
    without spills, or None where none does (the default then stays).

    Raises:
        autonorm.errors.CompileError: nvcc is missing or rejected a source.

    """
    from autonorm.runtime.offline import compile_offline

    chains = []
    for problem, rows, first in spilling:
        family = family_of(problem)
        chains.append([(config, family.render(config, problem, limits))
                       for config in leaner_defaults(problem, limits, rows, first)])
    kernels = [kernel for chain in chains for _, kernel in chain]
    reports = compile_offline(kernels, limits.arch) if kernels else {}
    return [next((config for config, kernel in chain if not reports[kernel.name].spills), None)
            for chain in chains]
