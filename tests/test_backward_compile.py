"""The backward kernels compile offline (nvcc 13, sm_90) without a warning.

A fixed-seed sample takes one configuration of every template branch the backward space has at
each sampled size (the row in registers, reloaded or staged; the sums' place; prefetch; a
cluster; one warp or several; even and ragged loops), each dtype and affine form, the
defaults and the shipped winners. No ``-diag-suppress``: a template declares a local only
where the variant uses it.
"""

from __future__ import annotations

import itertools
import random
from collections import defaultdict

import pytest
from test_compile_offline import nvcc_diagnostics, requires_nvcc, shipped_winners

from autonorm.ops import registry
from autonorm.ops.norm_backward.few_rows import FEW_ROWS, GROUP_ROWS, REREAD_ROWS
from autonorm.ops.norm_backward.plan import derive_plan
from autonorm.runtime.limits import H200
from autonorm.runtime.offline import compile_offline

HIDDEN = (1, 100, 1000, 4096, 65536)
DEFAULT_HIDDEN = (1, 768, 1000, 2048, 4096, 8192, 12288, 16384, 32768, 65536)
DTYPES = ("bfloat16", "float16", "float32")
FORMS = {
    "layer_norm_backward": ({}, {"has_bias": False}, {"has_weight": False, "has_bias": False},
                            {"residual": True}),
    "rms_norm_backward": ({}, {"weight_offset": True}, {"has_weight": False},
                          {"residual": True}),
}


def _branch(config, plan) -> tuple:  # noqa: ANN001
    """What decides the locals a backward kernel declares."""
    if config.groups > 1:
        # Groups add their meeting to the bulk branches: its locals depend on these only.
        return ("groups", config.acc, config.cluster > 1, config.hold, plan.even)
    return (config.cache, config.acc, config.prefetch, config.cluster > 1, config.hold,
            config.threads > 32, plan.even)


def backward_sample() -> list:
    """One kernel of every (op, weight form, template branch) met at the sampled sizes and
    dtypes, every default there and the shipped winners."""
    rng = random.Random("backward-warnings")
    kernels = {}
    for op, forms in FORMS.items():
        family = registry.get(op)
        for form in forms:
            groups = defaultdict(list)
            for hidden in HIDDEN:
                for dtype in DTYPES:
                    problem = family.problem(hidden=hidden, dtype=dtype, **form)
                    default = family.default(problem, H200)
                    kernel = family.render(default, problem, H200)
                    kernels.setdefault(kernel.name, kernel)
                    for config in family.space(problem, H200):
                        key = _branch(config, derive_plan(config, problem))
                        groups[key].append((config, problem))
            for key in sorted(groups, key=repr):
                config, problem = rng.choice(groups[key])
                kernel = family.render(config, problem, H200)
                kernels.setdefault(kernel.name, kernel)
    for kernel in shipped_winners(backward=True):
        kernels.setdefault(kernel.name, kernel)
    return list(kernels.values())


@requires_nvcc
@pytest.mark.slow
def test_backward_kernels_compile_without_warnings() -> None:
    kernels = backward_sample()
    assert {k.config.cache for k in kernels} == {"registers", "none", "bulk"}
    assert any(k.config.cluster > 1 for k in kernels)
    assert any(k.config.prefetch for k in kernels)
    assert any(k.config.hold for k in kernels)
    assert any(k.config.groups > 1 for k in kernels)
    status, found = nvcc_diagnostics(kernels)
    assert status == 0, "nvcc rejected the sample"
    by_name = {k.name: k for k in kernels}
    assert not found, "\n".join(
        f"{by_name[name].problem.describe()} {by_name[name].config.label()}: {line}"
        for name, lines in sorted(found.items()) for line in lines[:3])


@requires_nvcc
@pytest.mark.slow
def test_backward_defaults_fit_their_plans() -> None:
    # Every default (both norms, plain and after a fused add, three dtypes, 1 to 65536
    # elements, at any rows, at few and at the groups' buckets): no spills, and no more static
    # shared memory than the plan counts in its shared-memory rules.
    kernels = {}
    for op in FORMS:
        family = registry.get(op)
        for dtype in DTYPES:
            for hidden in DEFAULT_HIDDEN:
                forms = ({}, {"residual": True})
                for form, rows in itertools.product(
                        forms, (None, FEW_ROWS, 2, GROUP_ROWS, REREAD_ROWS)):
                    problem = family.problem(hidden=hidden, dtype=dtype, **form)
                    kernel = family.render(family.default(problem, H200, rows), problem, H200)
                    kernels.setdefault(kernel.name, kernel)
    reports = compile_offline(list(kernels.values()), "sm_90")
    assert any(k.config.cluster > 1 for k in kernels.values())
    assert any(k.config.hold for k in kernels.values())
    assert any(k.config.groups > 1 for k in kernels.values())
    assert any(k.config.acc == "reread" for k in kernels.values())
    for name, kernel in kernels.items():
        report, plan = reports[name], derive_plan(kernel.config, kernel.problem)
        what = f"{kernel.problem.describe()} {kernel.config.label()}"
        assert not report.spill_stores and not report.spill_loads, what
        assert report.static_smem <= plan.static_smem, (what, report.static_smem)
