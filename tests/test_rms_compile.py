"""RMSNorm kernels compile offline with nvcc: no warnings and no spills (no GPU).

The RMS statistic takes LayerNorm's templates down branches of their own (no shift, no mean,
Gemma's 1 + weight, the residual add), so a fixed-seed cover of those branches at hidden sizes
odd and even, in each dtype and weight form, is compiled for sm_90: with every diagnostic on (a
local the RMS branches leave unused shows as #177 or #550) and through ptxas (no local-memory
spills). Skips where nvcc is not installed (CI installs it).
"""

from __future__ import annotations

import itertools
import random
from collections import defaultdict

import pytest
from test_compile_offline import branch, nvcc_diagnostics, requires_nvcc

from autonorm.codegen.kernel import RenderedKernel
from autonorm.dtypes import DTYPES
from autonorm.ops import registry
from autonorm.ops.layer_norm.plan import derive_plan
from autonorm.ops.rms_norm.problem import Problem
from autonorm.runtime.limits import H200
from autonorm.runtime.offline import compile_offline

HIDDEN = (3, 1000, 4099, 16384, 65536)
FORMS = ((True, False), (True, True), (False, False))  # (has_weight, weight_offset)
EXTRA = 2  # configurations of other branches per hidden size, dtype and residual form
FAMILY = registry.get("rms_norm")


def rms_sample() -> list[RenderedKernel]:
    """Every template branch met at the sampled shapes once, plus per hidden size, dtype and
    residual form the default and EXTRA configurations of other branches; the weight forms are
    taken in turn (fixed seed)."""
    rng = random.Random("rms-compile")
    candidates: dict[tuple, list[tuple]] = defaultdict(list)
    picks: list[tuple] = []
    for hidden in HIDDEN:
        for dtype, residual in itertools.product(DTYPES, (False, True)):
            base = Problem(hidden, dtype, residual=residual)
            by_branch: dict[tuple, list] = defaultdict(list)
            for cfg in FAMILY.space(base, H200):  # validity does not depend on the weight form
                by_branch[branch(derive_plan(cfg, base, H200))].append(cfg)
            for key, configs in by_branch.items():
                candidates[key + (residual,)].append((rng.choice(configs), hidden, dtype, residual))
            picks.append((FAMILY.default(base, H200, 4096), hidden, dtype, residual))
            keys = sorted(by_branch, key=repr)
            for key in rng.sample(keys, min(EXTRA, len(keys))):
                picks.append((rng.choice(by_branch[key]), hidden, dtype, residual))
    picks += [rng.choice(candidates[key]) for key in sorted(candidates, key=repr)]
    kernels: dict[str, RenderedKernel] = {}
    for turn, (cfg, hidden, dtype, residual) in enumerate(picks):
        has_weight, woff = FORMS[turn % len(FORMS)]
        k = FAMILY.render(cfg, Problem(hidden, dtype, has_weight, woff, residual), H200)
        kernels.setdefault(k.name, k)
    return list(kernels.values())


@pytest.fixture(scope="module")
def sample() -> list[RenderedKernel]:
    return rms_sample()


def test_the_sample_covers_every_cache_and_weight_form(sample):
    assert len(sample) >= 150
    assert {k.config.cache for k in sample} == {"none", "registers", "smem", "bulk"}
    assert {(k.problem.has_weight, k.problem.weight_offset) for k in sample} == set(FORMS)
    assert any(k.config.cluster > 1 for k in sample)
    assert any(derive_plan(k.config, k.problem, H200).shape.skewed for k in sample)
    residual = [k for k in sample if k.problem.residual]
    assert len(residual) >= 40 and {k.config.cache for k in residual} == {
        "registers", "smem", "bulk"}
    assert any(derive_plan(k.config, k.problem, H200).shape.skewed for k in residual)


@requires_nvcc
@pytest.mark.slow
def test_rms_kernels_compile_without_warnings(sample):
    status, found = nvcc_diagnostics(sample)
    lines = [f"{name}: {d}" for name, diags in found.items() for d in diags]
    assert status == 0 and not lines, "\n".join(lines[:40])


@requires_nvcc
@pytest.mark.slow
def test_rms_kernels_compile_without_spills(sample):
    reports = compile_offline(sample, "sm_90")
    spilled = [f"{k.problem.describe()} {k.config.label()}: {reports[k.name].spill_stores} B"
               for k in sample if reports[k.name].spills]
    assert len(reports) >= len(sample)
    assert not spilled, "\n".join(spilled)
