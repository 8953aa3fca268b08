"""Offline nvcc compilation of the defaults the few-row and skewed rules pick (no GPU).

The few-row shapes hold x, the residual, weight and bias in registers (three 8-byte vectors a
thread at 768 and 1536 in 16-bit, 512 threads at 6144 and 8192 in fp32 after the add), and
RMSNorm after the add takes one stage of the skewed bulk kernel: each default must compile for
sm_90 without local memory. Skips itself where nvcc is not installed (CI installs it).
"""

from __future__ import annotations

import pytest
from test_compile_offline import requires_nvcc

from autonorm.ops import registry
from autonorm.runtime.limits import H200
from autonorm.runtime.offline import compile_offline

DTYPES = ("bfloat16", "float16", "float32")


def few_row_problems():
    """Every norm form at the hidden sizes whose few-row defaults the rules above pick."""
    layer, rms = registry.get("layer_norm"), registry.get("rms_norm")
    for dtype in DTYPES:
        for residual in (False, True):
            for hidden in (768, 1536, 6144, 8192):
                for weight, bias in ((True, True), (True, False), (False, True)):
                    yield layer.problem(hidden=hidden, dtype=dtype, residual=residual,
                                        has_weight=weight, has_bias=bias)
                for offset in (False, True):
                    yield rms.problem(hidden=hidden, dtype=dtype, residual=residual,
                                      weight_offset=offset)


def skewed_added_problems():
    """RMSNorm after the add on rows the vector does not divide, 2-32 KB."""
    rms = registry.get("rms_norm")
    for dtype in DTYPES:
        for hidden in (2049, 2053, 4097, 4099, 8191, 12289, 16385):
            for offset in (False, True):
                yield rms.problem(hidden=hidden, dtype=dtype, residual=True, weight_offset=offset)


@pytest.fixture(scope="module")
def defaults():
    """The distinct default kernels: few-row row counts, and the skewed rows' bulk grid."""
    kernels = {}
    for problem in few_row_problems():
        family = registry.family_of(problem)
        for rows in (1, 8, 64, 128, 256):
            config = family.default(problem, H200, rows)
            rendered = family.render(config, problem, H200)
            kernels.setdefault(rendered.name, (problem, config, rendered))
    for problem in skewed_added_problems():
        family = registry.family_of(problem)
        config = family.default(problem, H200, (1 << 26) // problem.hidden)
        rendered = family.render(config, problem, H200)
        kernels.setdefault(rendered.name, (problem, config, rendered))
    return list(kernels.values())


def test_the_defaults_cover_the_new_shapes(defaults):
    labels = {config.label() for _, config, _ in defaults}
    for label in ("t64v4r1-registers-two_pass-c1-p0-e", "t128v4r2-registers-two_pass-c1-p0-e",
                  "t256v4r2-registers-two_pass-c1-p0-e", "t512v4r1-registers-two_pass-c1-p0-e",
                  "t128v8r1-bulk-two_pass-c1-p0-s1-k"):
        assert label in labels
    assert len(defaults) > 150


@requires_nvcc
@pytest.mark.slow
def test_the_defaults_compile_without_spills(defaults):
    reports = compile_offline([rendered for _, _, rendered in defaults], "sm_90")
    spilling = [(problem, config.label(), reports[rendered.name])
                for problem, config, rendered in defaults if reports[rendered.name].spills]
    assert spilling == []
    assert max(reports[rendered.name].registers for _, _, rendered in defaults) <= 128
