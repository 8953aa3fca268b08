"""The backward kernels compile offline (nvcc 13, sm_90) without a warning.

A fixed-seed sample takes one configuration of every template branch the backward space has at
each sampled size (the row in registers, reloaded or staged; the sums' place; prefetch; a
cluster; one warp or several; even and ragged loops), each dtype and affine form, and the
defaults. No ``-diag-suppress``: a template declares a local only where the variant uses it.
"""

from __future__ import annotations

import random
from collections import defaultdict

import pytest
from test_compile_offline import nvcc_diagnostics, requires_nvcc

from autonorm.ops import registry
from autonorm.ops.norm_backward.plan import derive_plan
from autonorm.runtime.limits import H200

HIDDEN = (1, 100, 1000, 4096, 65536)
DTYPES = ("bfloat16", "float16", "float32")
FORMS = {
    "layer_norm_backward": ({}, {"has_bias": False}, {"has_weight": False, "has_bias": False},
                            {"residual": True}),
    "rms_norm_backward": ({}, {"weight_offset": True}, {"has_weight": False},
                          {"residual": True}),
}


def _branch(config, plan) -> tuple:  # noqa: ANN001
    """What decides the locals a backward kernel declares."""
    return (config.cache, config.acc, config.prefetch, config.cluster > 1,
            config.threads > 32, plan.even)


def backward_sample() -> list:
    """One kernel of every (op, weight form, template branch) met at the sampled sizes and
    dtypes, and every default there."""
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
    return list(kernels.values())


@requires_nvcc
@pytest.mark.slow
def test_backward_kernels_compile_without_warnings() -> None:
    kernels = backward_sample()
    assert {k.config.cache for k in kernels} == {"registers", "none", "bulk"}
    assert any(k.config.cluster > 1 for k in kernels)
    assert any(k.config.prefetch for k in kernels)
    status, found = nvcc_diagnostics(kernels)
    assert status == 0, "nvcc rejected the sample"
    by_name = {k.name: k for k in kernels}
    assert not found, "\n".join(
        f"{by_name[name].problem.describe()} {by_name[name].config.label()}: {line}"
        for name, lines in sorted(found.items()) for line in lines[:3])
