"""Offline nvcc compilation of the defaults the few-row, skewed and long-row rules pick (no GPU).

The few-row shapes hold x, the residual, weight and bias in registers (three 8-byte vectors a
thread at 768 and 1536 in 16-bit, 512 threads at 6144 and 8192 in fp32 after the add),
RMSNorm after the add takes one stage of the skewed bulk kernel, and skewed 16-bit rows up to
4 KB take the bulk kernel's tiles of several rows: each default must compile for
sm_90 without local memory. Skips itself where nvcc is not installed (CI installs it).
"""

from __future__ import annotations

import pytest
from test_compile_offline import requires_nvcc

from autonorm.dtypes import DTYPES
from autonorm.ops import registry
from autonorm.runtime.limits import H200
from autonorm.runtime.offline import compile_offline


def few_row_launches():
    """Every norm form at the hidden sizes whose few-row defaults the rules above pick, at 1-256
    rows."""
    layer, rms = registry.get("layer_norm"), registry.get("rms_norm")
    for dtype in DTYPES:
        for residual in (False, True):
            for hidden in (768, 1536, 6144, 8192):
                problems = [layer.problem(hidden=hidden, dtype=dtype, residual=residual,
                                          has_weight=weight, has_bias=bias)
                            for weight, bias in ((True, True), (True, False), (False, True))]
                problems += [rms.problem(hidden=hidden, dtype=dtype, residual=residual,
                                         weight_offset=offset) for offset in (False, True)]
                for problem in problems:
                    for rows in (1, 8, 64, 128, 256):
                        yield problem, rows


def skewed_added_launches():
    """RMSNorm after the add on rows the vector does not divide, 2-32 KB, at 2^26 elements."""
    rms = registry.get("rms_norm")
    for dtype in DTYPES:
        for hidden in (2049, 2053, 4097, 4099, 8191, 12289, 16385):
            for offset in (False, True):
                problem = rms.problem(hidden=hidden, dtype=dtype, residual=True,
                                      weight_offset=offset)
                yield problem, (1 << 26) // hidden


def long_rms_launches():
    """RMSNorm rows past one block's row cache: its default splits them over a cluster's
    shared memory (odd rows unevenly; many odd rows of up to 256 KB over the bulk kernel's
    cluster in runs), or reads them twice (cache "none") past that too."""
    rms = registry.get("rms_norm")
    for dtype in DTYPES:
        for hidden in (65535, 131071, 262145, 1048576):
            for form in ({}, {"weight_offset": True}, {"has_weight": False}):
                for rows in (1, 4096):
                    yield rms.problem(hidden=hidden, dtype=dtype, **form), rows


def skewed_tile_launches():
    """16-bit rows off the vector grid up to 4 KB at 2^26 elements: the bulk kernel's tiles of
    several rows (a warp a row, 64 or 128 threads), in LayerNorm's forms and RMSNorm's."""
    layer, rms = registry.get("layer_norm"), registry.get("rms_norm")
    for dtype in ("bfloat16", "float16"):
        for hidden in (293, 389, 395, 483, 490, 506, 507, 651, 745, 850, 923, 1013, 1023, 1025,
                       1333, 2047):
            problems = [layer.problem(hidden=hidden, dtype=dtype, residual=residual,
                                      has_weight=weight, has_bias=bias)
                        for residual in (False, True)
                        for weight, bias in ((True, True), (True, False), (False, True))]
            problems += [rms.problem(hidden=hidden, dtype=dtype, residual=residual,
                                     weight_offset=offset)
                         for residual in (False, True) for offset in (False, True)]
            for problem in problems:
                yield problem, (1 << 26) // hidden


@pytest.fixture(scope="module")
def defaults():
    """The distinct default kernels of those launches."""
    kernels = {}
    for launches in (few_row_launches(), skewed_added_launches(), long_rms_launches(),
                     skewed_tile_launches()):
        for problem, rows in launches:
            family = registry.family_of(problem)
            config = family.default(problem, H200, rows)
            rendered = family.render(config, problem, H200)
            kernels.setdefault(rendered.name, (problem, config, rendered))
    return list(kernels.values())


def test_the_defaults_cover_the_new_shapes(defaults):
    labels = {config.label() for _, config, _ in defaults}
    for label in ("t64v4r1-registers-two_pass-c1-p0-e", "t128v4r2-registers-two_pass-c1-p0-e",
                  "t256v4r2-registers-two_pass-c1-p0-e", "t512v4r1-registers-two_pass-c1-p0-e",
                  "t128v8r1-bulk-two_pass-c1-p0-s1-k", "t1024v4r1-none-two_pass-c1-p0",
                  "t1024v8r1-none-two_pass-c1-p0", "t512v8r1-smem-two_pass-c4-p0",
                  "t512v8r1-bulk-two_pass-c8-p0-s2-k", "t512v4r1-bulk-two_pass-c8-p0-s2-k",
                  "t512v4r1-smem-two_pass-c8-p0", "t256v8r8-bulk-two_pass-c1-p0-s1-k",
                  "t128v8r2-bulk-two_pass-c1-p0-s1-k", "t256v8r4-bulk-two_pass-c1-p0-s1-k",
                  "t256v8r4-bulk-two_pass-c1-p0-s2-k",
                  "t256v8r2-bulk-two_pass-c1-p0-s2-k"):
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
