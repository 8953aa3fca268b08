"""What runs untuned on each GPU kind compiles for it without spills (nvcc, no GPU).

On a GPU kind with no winners every shape runs its family's default, picked from the device's
limits: Turing's 1024 threads and 64 KB an SM, the 1536 threads and 100 KB of Ampere's and
Ada's smaller parts and of consumer Blackwell, the clusters and bulk copies of sm_90 and newer.
The register estimates behind the defaults are fitted to sm_90's ptxas, so where a default
spills on its own architecture dispatch runs the first leaner pick that does not
(:mod:`autonorm.fallback`). Each kind autonorm knows (:data:`autonorm.export.arch.KNOWN`, the
kinds ``autonorm export --arch`` takes) gets a sample of defaults: every family in a few forms,
bf16 and fp32, rows of 512 to 65536 elements, one row and 2^26 elements. Each is compiled for
the kind's architecture and, where it spills, its leaner picks with it: the first that does not
spill is what dispatch runs, and one must exist but for the defaults listed in UNSOLVED, which
dispatch keeps. Skips itself where nvcc is missing or lacks the architecture.
"""

from __future__ import annotations

import functools
import itertools

import pytest
from test_compile_offline import requires_nvcc
from test_export_arch import NVCC_ARCHS

from autonorm.errors import ConfigError
from autonorm.export.arch import KNOWN
from autonorm.fallback import leaner_offline
from autonorm.ops import registry
from autonorm.runtime.offline import compile_offline

FORMS = {
    "layer_norm": ({}, {"residual": True}),
    "rms_norm": ({}, {"weight_offset": True}),
    "layer_norm_backward": ({}, {"has_weight": False, "has_bias": False}, {"residual": True}),
    "rms_norm_backward": ({},),
}
HIDDEN = (512, 1024, 4096, 5120, 8192, 12288, 16384, 32768, 65536)
ROWS = (1, None)  # None: 2^26 elements

# Defaults that spill on their kind with no leaner pick that does not: (cc, op, dtype, hidden,
# label). A pick must keep the default's row cache (autonorm.fallback): for 16-bit LayerNorm
# backward of 12288 and 16384 on sm_75-sm_89 only kernels that read the row again fit, and on
# the H200 those ran 2.4x-4.5x slower than spilling defaults of the same kind, so the default
# stays.
UNSOLVED: set[tuple[int, str, str, int, str]] = {
    (75, "layer_norm_backward", "bfloat16", 12288, "t512v2-registers-accglobal-p1"),
    (75, "layer_norm_backward", "bfloat16", 12288, "t512v8-registers-accregisters-p1"),
    (75, "layer_norm_backward", "bfloat16", 16384, "t512v4-registers-accregisters-p1"),
    (80, "layer_norm_backward", "bfloat16", 12288, "t512v2-registers-accsmem-p1"),
    (80, "layer_norm_backward", "bfloat16", 16384, "t512v4-registers-accregisters-p1"),
    (86, "layer_norm_backward", "bfloat16", 12288, "t512v2-registers-accglobal-p1"),
    (86, "layer_norm_backward", "bfloat16", 16384, "t512v4-registers-accregisters-p1"),
    (89, "layer_norm_backward", "bfloat16", 12288, "t512v2-registers-accglobal-p1"),
    (89, "layer_norm_backward", "bfloat16", 16384, "t512v4-registers-accregisters-p1"),
}


def launches(limits):
    """Yield (family, problem, rows) of the sample on ``limits`` that some kernel runs."""
    for op, forms in FORMS.items():
        family = registry.get(op)
        for form, dtype, hidden in itertools.product(forms, ("bfloat16", "float32"), HIDDEN):
            problem = family.problem(hidden=hidden, dtype=dtype, **form)
            for rows in ROWS:
                count = rows or (1 << 26) // hidden
                try:
                    family.default(problem, limits, count)
                except ConfigError:
                    break  # nothing runs it there (a float32 row past Turing's 64 KB, added)
                yield family, problem, count


@functools.cache
def defaults(cc: int) -> dict:
    """The sample's distinct default kernels on kind ``cc``: name -> (family, problem, rows,
    config, kernel). Cached: both tests of a kind read the same sample."""
    limits = KNOWN[cc]
    kernels = {}
    for family, problem, rows in launches(limits):
        config = family.default(problem, limits, rows)
        kernel = family.render(config, problem, limits)
        kernels.setdefault(kernel.name, (family, problem, rows, config, kernel))
    return kernels


def test_the_sample_reaches_each_kinds_own_kernels():
    for cc in KNOWN:
        labels = [config.label() for *_, config, _ in defaults(cc).values()]
        assert len(labels) >= 60, (cc, len(labels))
        # Bulk copies and clusters on sm_90 and newer only.
        assert any("bulk" in label for label in labels) == (cc >= 90), cc


@requires_nvcc
@pytest.mark.slow
@pytest.mark.parametrize("cc", sorted(KNOWN), ids=lambda cc: f"sm_{cc}")
def test_what_runs_untuned_does_not_spill(cc):
    if cc not in NVCC_ARCHS:
        pytest.skip(f"nvcc has no sm_{cc}")
    limits = KNOWN[cc]
    kernels = defaults(cc)
    reports = compile_offline([entry[-1] for entry in kernels.values()], limits.arch)
    spilling = [entry for name, entry in kernels.items() if reports[name].spills]
    picks = leaner_offline([(problem, rows, first) for _, problem, rows, first, _ in spilling],
                           limits)
    unsolved, solved = [], []
    for (family, problem, _, first, _), runs in zip(spilling, picks, strict=True):
        entry = (cc, family.op, problem.dtype, problem.hidden, first.label())
        if runs is None:
            unsolved.append(entry)
        else:
            solved.append(f"{problem.describe()}: {first.label()} -> {runs.label()}")
    print(f"\nsm_{cc}: {len(kernels)} defaults, {len(spilling)} spill, {len(solved)} of them "
          "with a leaner pick that does not")
    for line in solved:
        print("  ", line)
    assert set(unsolved) <= UNSOLVED, sorted(set(unsolved) - UNSOLVED)
    # An entry that no longer spills, or now has a leaner pick, leaves the list.
    assert set(unsolved) >= {entry for entry in UNSOLVED if entry[0] == cc}
