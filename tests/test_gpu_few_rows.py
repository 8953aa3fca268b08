"""GPU: the default's few-row shapes verify, and broken early weight loads fail.

At 256 rows or fewer of up to 8 KB the default gives each row a block at two vectors a thread,
and the kernel loads weight and bias beside x (``plan.early_affine``; docs/kernels.md, few
rows); rows of 8-32 KB take 256 threads with the loads asked for (``KernelConfig.early``), or
512 threads. These tests verify those kernels against float64 for LayerNorm and RMSNorm, with and
without the residual add, in every dtype, on rows on and off the vector grid (the verifier's
cases meet every row alignment), hold fp32 to 1e-6 on rows of mean 1000 and spread 0.1, and
show that the verifier rejects a kernel whose early loads read the wrong array or the
unshifted weights of a skewed row.
"""

from __future__ import annotations

import pytest
from test_gpu_skew import (  # compiled: the fixture, compiling in a process pool
    assert_break_rejected,
    compiled,  # noqa: F401
    verify_all,
    verify_offset_rows,
)

from autonorm.dtypes import DTYPES
from autonorm.ops import registry
from autonorm.ops.layer_norm.heuristic import few_rows_config
from autonorm.ops.layer_norm.plan import derive_plan

pytestmark = pytest.mark.gpu

HIDDEN = (490, 768, 1001, 1072, 1536, 2053, 2416, 3072, 4096)  # 768-3072: three vectors
ROWS = (1, 256)

# (text, replacement) in an early-affine kernel: the weights read from the bias, and a skewed
# row's weights read on the aligned grid instead of shifted to the row's start.
BREAKS = {
    "weights-from-bias": ("wpre[it] = load_vec(wseg", "wpre[it] = load_vec(bseg"),
    "weights-unshifted": ("wpre[it] = load_shifted(wseg, j, h);",
                          "wpre[it] = load_vec(wseg + (size_t)j * V);"),
}


def few_row_work(dtype: str, limits, residual: bool = False) -> list[tuple]:  # noqa: ANN001
    """(problem, rendered) for the few-row default of each op, hidden size and rows bucket."""
    work = []
    for op in ("layer_norm", "rms_norm"):
        family = registry.get(op)
        for hidden in HIDDEN:
            problem = family.problem(hidden=hidden, dtype=dtype, residual=residual)
            if hidden * problem.itemsize > 8192:
                continue  # rows of 8-32 KB: test_the_long_few_row_defaults_verify
            for rows in ROWS:
                config = family.default(problem, limits, rows)
                if config == few_rows_config(problem, rows, limits):
                    work.append((problem, family.render(config, problem, limits)))
    return work


@pytest.mark.parametrize("residual", (False, True))
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_few_row_defaults_verify(compiled, dtype: str, residual: bool) -> None:  # noqa: F811
    limits = compiled.limits
    work = few_row_work(dtype, limits, residual)
    plans = [derive_plan(r.config, p, limits) for p, r in work]
    assert len(work) >= 12 and all(plan.early_affine for plan in plans)
    assert any(plan.shape.skewed for plan in plans)
    verify_all(compiled, work)
    print(f"\n{dtype} residual={residual}: {len(work)} few-row kernels verified")


@pytest.mark.parametrize("residual", (False, True))
@pytest.mark.parametrize("op", ("layer_norm", "rms_norm"))
@pytest.mark.parametrize("hidden", (490, 1001, 1536))
def test_fp32_offset_rows_stay_within_1e6_in_the_few_row_shape(compiled, op, hidden, residual) -> None:  # noqa: F811, ANN001, E501
    family = registry.get(op)
    problem = family.problem(hidden=hidden, dtype="float32", residual=residual)
    config = few_rows_config(problem, 1, compiled.limits)
    assert config is not None and derive_plan(config, problem, compiled.limits).early_affine
    verify_offset_rows(compiled, problem, family.render(config, problem, compiled.limits))


@pytest.mark.parametrize("residual", (False, True))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(BREAKS))
def test_a_broken_early_weight_load_is_rejected(compiled, dtype: str, name: str, residual: bool) -> None:  # noqa: F811, E501
    old, new = BREAKS[name]
    family = registry.get("layer_norm")
    hidden = 1072 if name == "weights-from-bias" else 1001  # on the vector grid, then off it
    problem = family.problem(hidden=hidden, dtype=dtype, residual=residual)
    config = few_rows_config(problem, 1, compiled.limits)
    assert config is not None
    rendered = family.render(config, problem, compiled.limits)
    assert_break_rejected(compiled, problem, rendered, old, new, name)


# Rows of 8-32 KB: 256 threads at 3-8 vectors with the weights loaded early (``early``), 512
# for longer 16-bit rows and skewed ones past four vectors.
LONG_HIDDEN = (3072, 4095, 6001, 8192, 12288, 16384)
LONG_ROWS = (1, 64, 256)


@pytest.mark.parametrize("residual", (False, True))
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_long_few_row_defaults_verify(compiled, dtype: str, residual: bool) -> None:  # noqa: F811
    limits = compiled.limits
    work, plans = [], []
    for op in ("layer_norm", "rms_norm"):
        family = registry.get(op)
        for hidden in LONG_HIDDEN:
            problem = family.problem(hidden=hidden, dtype=dtype, residual=residual)
            for rows in LONG_ROWS:
                config = family.default(problem, limits, rows)
                long_row = hidden * problem.itemsize > 8192
                if long_row and config == few_rows_config(problem, rows, limits):
                    work.append((problem, family.render(config, problem, limits)))
                    plans.append(derive_plan(config, problem, limits))
    assert len(work) >= 12
    assert any(plan.config.early and plan.shape.iters > 2 for plan in plans)
    verify_all(compiled, work)
    print(f"\n{dtype} residual={residual}: {len(work)} long few-row kernels verified")


@pytest.mark.parametrize("residual", (False, True))
@pytest.mark.parametrize("op", ("layer_norm", "rms_norm"))
def test_fp32_offset_rows_stay_within_1e6_with_early_loads_of_8_vectors(compiled, op, residual) -> None:  # noqa: F811, ANN001, E501
    family = registry.get(op)
    problem = family.problem(hidden=8192, dtype="float32", residual=residual)
    config = few_rows_config(problem, 64, compiled.limits)
    assert config is not None
    plan = derive_plan(config, problem, compiled.limits)
    assert plan.early_affine and plan.lean_fp32 and plan.shape.iters >= 4
    verify_offset_rows(compiled, problem, family.render(config, problem, compiled.limits))


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_broken_long_early_weight_load_is_rejected(compiled, dtype: str) -> None:  # noqa: F811
    old, new = BREAKS["weights-from-bias"]
    family = registry.get("layer_norm")
    itemsize = family.problem(hidden=1, dtype=dtype).itemsize
    problem = family.problem(hidden=16384 // itemsize, dtype=dtype)  # 16 KB: 4 vectors a thread
    config = few_rows_config(problem, 1, compiled.limits)
    assert config is not None and config.early
    rendered = family.render(config, problem, compiled.limits)
    assert_break_rejected(compiled, problem, rendered, old, new, name="long-weights-from-bias")


@pytest.mark.parametrize("op", ("layer_norm", "rms_norm"))
def test_an_fp32_scale_without_eps_is_rejected(compiled, op: str) -> None:  # noqa: F811
    # The lean fp32 scale (rsqrtf): dropping eps leaves constant rows at 1 / 0.
    family = registry.get(op)
    problem = family.problem(hidden=1072, dtype="float32")
    config = few_rows_config(problem, 1, compiled.limits)
    assert config is not None and derive_plan(config, problem, compiled.limits).lean_fp32
    rendered = family.render(config, problem, compiled.limits)
    assert_break_rejected(compiled, problem, rendered, "rsqrtf(var + eps)", "rsqrtf(var)",
                          "scale-without-eps")
