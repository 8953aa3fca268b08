"""GPU: the bulk-copy kernel (cache="bulk") verifies against float64, and broken variants fail."""

from __future__ import annotations

import dataclasses
import random

import pytest

from autonorm.dtypes import DTYPES
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.space import bulk_seed_configs, enumerate_space

pytestmark = pytest.mark.gpu

HIDDEN = (1000, 4096, 16384, 65536)


def _configs(problem: Problem, limits) -> list[KernelConfig]:  # noqa: ANN001
    bulk = [c for c in enumerate_space(problem, limits) if c.cache == "bulk"]
    rng = random.Random(f"bulk-{problem.hidden}-{problem.dtype}")
    seeds = bulk_seed_configs(problem, limits)[:2]
    return seeds + [c for c in rng.sample(bulk, min(2, len(bulk))) if c not in seeds]


def _kernel(config: KernelConfig, problem: Problem, source_patch=None):  # noqa: ANN001, ANN202
    from autonorm.ops import layer_norm as codegen
    from autonorm.runtime import compiler

    rendered = codegen.render(config, problem)
    if source_patch is not None:
        old, new = source_patch
        assert old in rendered.source, old
        rendered = dataclasses.replace(rendered, source=rendered.source.replace(old, new))
    return compiler.compile_kernel(rendered)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_bulk_configs_verify(dtype: str, hidden: int) -> None:
    from autonorm.ops.layer_norm.verify import verify
    from autonorm.runtime.device import query_device

    limits = query_device().limits()
    problem = Problem(hidden, dtype)
    configs = _configs(problem, limits)
    assert configs, "no bulk configuration for this shape"
    failures = []
    for config in configs:
        result = verify(_kernel(config, problem), problem)
        if not result.ok:
            failures.append(f"{config.label()}: {result.summary()}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("affine", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("cluster", [1, 2])
def test_bulk_affine_variants_verify(affine: tuple[bool, bool], cluster: int) -> None:
    from autonorm.ops.layer_norm.verify import verify

    problem = Problem(16384, "bfloat16", *affine)
    config = KernelConfig(512, 8, 1, "bulk", "two_pass", cluster, 0, 2)
    assert verify(_kernel(config, problem), problem).ok


@pytest.mark.parametrize("cluster", [1, 4])
def test_bulk_offset_rows_within_1e_6(cluster: int) -> None:
    from autonorm.ops.layer_norm.verify import verify

    problem = Problem(65536 if cluster > 1 else 4096, "float32")
    config = KernelConfig(512, 4, 1, "bulk", "two_pass", cluster, 0, 2)
    result = verify(_kernel(config, problem), problem)
    assert result.ok, result.summary()
    assert result.errors["offset"].rel_l2 <= 1e-6


BROKEN = {
    # Each block normalizes with its own segment's statistics: the cluster merge is skipped.
    "no-cluster-merge": (
        KernelConfig(512, 4, 1, "bulk", "two_pass", 2, 0, 2),
        Problem(32768, "float32"),
        ("cmean = m_acc - (cshift - s0);", "(void)m_acc;"),
    ),
    # Pass 2 about zero instead of the row's centre: E[x^2] - E[x]^2, and rows near 1000 lose
    # their variance. (Dropping only the shift no longer breaks fp32: the corrected two-pass
    # re-centres on pass 1's mean; measured passing on the H200.)
    "uncentred-pass-2": (
        KernelConfig(512, 4, 1, "bulk", "two_pass", 1, 0, 2),
        Problem(4096, "float32"),
        ("const float centre = shift + mean;", "const float centre = 0.f;"),
    ),
}


# The fp32 two-pass before the correction (docs/accuracy.md): the segment's mean is pass 1's sum
# of x - shift alone, about the shift.
UNCORRECTED = (
    "    const float cshift = centre;\n"
    "    float cmean = s3 * INV_SEG;  // of x - centre, over this segment\n"
    "    s2 = fmaxf(s2 - (float)SEG * cmean * cmean, 0.f);\n",
    "    const float cshift = shift;\n"
    "    float cmean = mean;\n",
)


@pytest.mark.parametrize(("hidden", "cluster"), [(16384, 1), (65536, 4)])
def test_uncorrected_two_pass_fails_only_on_an_outlier_shift(hidden: int, cluster: int) -> None:
    """The check can fail: an outlier first element costs the uncorrected fp32 two-pass bits."""
    from autonorm.ops.layer_norm.verify import verify

    problem = Problem(hidden, "float32")
    config = KernelConfig(512, 4, 1, "bulk", "two_pass", cluster, 0, 2)
    good = verify(_kernel(config, problem), problem)
    assert good.ok, good.summary()
    assert good.errors["offset-outlier-first"].rel_l2 <= 1e-6
    bad = verify(_kernel(config, problem, UNCORRECTED), problem)
    assert not bad.ok
    assert all(f.startswith("offset-outlier-first:") for f in bad.failures), bad.failures


# Not here: a variant that never refills a stage. It waits on its mbarrier forever and hung the
# GPU test run; a hang is the isolated evaluator's job to survive, not verify's.


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_bulk_variants_are_rejected(name: str) -> None:
    """The check can fail: each deliberately broken bulk kernel fails verification."""
    from autonorm.ops.layer_norm.verify import verify

    config, problem, patch = BROKEN[name]
    good = verify(_kernel(config, problem), problem)
    assert good.ok, good.summary()
    bad = verify(_kernel(config, problem, patch), problem)
    assert not bad.ok, f"{name} passed verification"


@pytest.mark.parametrize(("threads", "cluster"), [(1024, 1), (512, 4)])
def test_bulk_grid_is_what_can_be_resident(threads: int, cluster: int) -> None:
    from autonorm.runtime.device import query_device

    info = query_device()
    problem = Problem(65536, "bfloat16")
    kernel = _kernel(KernelConfig(threads, 8, 1, "bulk", "two_pass", cluster, 0, 1), problem)
    resident = kernel.resident_clusters
    assert resident is not None and resident >= 1
    if cluster == 1:
        assert resident % info.sm_count == 0  # blocks per SM x SMs
    else:
        assert resident * cluster <= info.sm_count * kernel.plan.blocks_per_sm
    rows = 100_000
    assert kernel.grid(rows) == resident * cluster
    assert kernel.grid(3) == 3 * cluster  # never more clusters than row tiles


def test_evaluator_times_a_bulk_kernel() -> None:
    from autonorm.tune.evaluator import GpuEvaluator

    problem = Problem(16384, "bfloat16")
    evaluator = GpuEvaluator(problem, rows=4096)
    outcome = evaluator.evaluate(KernelConfig(512, 8, 1, "bulk", "two_pass", 1, 0, 2))
    assert outcome.ok, outcome
    assert outcome.timing.share > 0.5
