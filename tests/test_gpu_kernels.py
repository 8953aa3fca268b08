"""GPU: every configuration of a sampled sweep verifies against float64; the unstable one fails."""

from __future__ import annotations

import random

import pytest

from autonorm.space import DTYPES, KernelConfig, Problem, default_config, enumerate_space

pytestmark = pytest.mark.gpu

HIDDEN = (768, 1000, 4096, 16384, 65536)
PER_SHAPE = 8


def _sample(problem: Problem, limits) -> list[KernelConfig]:  # noqa: ANN001
    space = enumerate_space(problem, limits)
    rng = random.Random(f"{problem.hidden}-{problem.dtype}")
    picks = rng.sample(space, min(PER_SHAPE, len(space)))
    return [default_config(problem, limits), *picks]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_sampled_sweep_verifies(dtype: str, hidden: int) -> None:
    from autonorm import codegen, compiler
    from autonorm.device import query_device
    from autonorm.verify import verify

    limits = query_device().limits()
    problem = Problem(hidden, dtype)
    failures = []
    for config in _sample(problem, limits):
        kernel = compiler.compile_kernel(codegen.render(config, problem, limits))
        result = verify(kernel, problem)
        if not result.ok:
            failures.append(f"{config.label()}: {result.summary()}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("affine", [(False, False), (True, False), (False, True)])
def test_affine_variants_verify(affine: tuple[bool, bool]) -> None:
    from autonorm import codegen, compiler
    from autonorm.verify import verify

    problem = Problem(4096, "bfloat16", *affine)
    kernel = compiler.compile_kernel(codegen.render(default_config(problem), problem))
    assert verify(kernel, problem).ok


def test_unstable_variant_is_rejected_and_stable_ones_pass() -> None:
    """The check can fail: E[x^2]-E[x]^2 without a shift loses the offset rows' variance."""
    from autonorm import codegen, compiler
    from autonorm.verify import verify

    problem = Problem(4096, "float32")
    base = KernelConfig(256, 4, 1, "registers", "two_pass", 1, 0)
    naive = KernelConfig(256, 4, 1, "registers", "naive", 1, 0)
    bad = verify(
        compiler.compile_kernel(codegen.render(naive, problem, allow_unstable=True)), problem
    )
    assert not bad.ok
    assert any(f.startswith("offset") for f in bad.failures), bad.failures
    assert bad.errors["offset"].rel_l2 > 1e-3
    for stats in ("two_pass", "welford"):
        config = KernelConfig.from_dict({**base.to_dict(), "stats": stats})
        good = verify(compiler.compile_kernel(codegen.render(config, problem)), problem)
        assert good.ok, good.summary()
        # The target: fp32 on rows with mean 1000 and spread 0.1 within 1e-6 of float64.
        assert good.errors["offset"].rel_l2 <= 1e-6
