"""GPU: the backward defaults at few rows verify in every form of both norms.

At one row the default holds a short row in registers; at 2-256 rows it is the groups' (2-8
rows), the kernel forming the column sums again from the rows (``acc="reread"``;
docs/backward.md) or the few-row form. ``test_gpu_backward``
covers the plain problems; these are the others: LayerNorm without a bias and without weight
and bias, RMSNorm with Gemma's ``1 + weight`` and without a weight, and both after the fused
residual add, in every dtype, at hidden sizes the rule sends to each form, and with them the
default at the grid's row count. Each verifies against float64 (its cases meet one row, few
rows and rows on three grids) and, in fp32, holds dx and the column sums within 1e-5 on rows of
mean 1000 and spread 0.1.
"""

from __future__ import annotations

import itertools

import pytest

from autonorm.ops import registry
from autonorm.ops.norm_backward.few_rows import REREAD_ROWS
from autonorm.ops.norm_backward.verify import verify

pytestmark = pytest.mark.gpu

FORMS = {
    "layer_norm_backward": ({"has_bias": False}, {"has_weight": False, "has_bias": False},
                            {"residual": True}),
    "rms_norm_backward": ({"weight_offset": True}, {"has_weight": False}, {"residual": True}),
}
HIDDEN = (1000, 4096, 8192)
ROWS = (1, 8, 64, REREAD_ROWS, None)  # None: the grid's, 2^26 // hidden


@pytest.fixture(scope="module")
def limits():  # noqa: ANN201
    from autonorm.runtime.device import query_device

    return query_device(0).limits()


def _defaults(op: str, dtype: str, limits) -> list:  # noqa: ANN001
    """Each form's distinct defaults at the rows above: (problem, rendered kernel)."""
    family = registry.get(op)
    work = {}
    for form, hidden, rows in itertools.product(FORMS[op], HIDDEN, ROWS):
        problem = family.problem(hidden=hidden, dtype=dtype, **form)
        config = family.default(problem, limits, rows or (1 << 26) // hidden)
        kernel = family.render(config, problem, limits)
        work.setdefault(kernel.name, (problem, kernel))
    return list(work.values())


@pytest.mark.parametrize("op", FORMS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_few_row_defaults_verify_in_every_form(op: str, dtype: str, limits) -> None:  # noqa: ANN001
    from autonorm.runtime.compiler import CompilePool, compile_kernel
    from autonorm.runtime.device import query_device

    work = _defaults(op, dtype, limits)
    assert any(k.config.acc == "reread" for _, k in work)
    pool = CompilePool()
    try:
        for _, kernel in work:
            pool.submit(kernel, query_device(0).arch)
        failures = []
        for problem, kernel in work:
            assert pool.wait(kernel) is None, kernel.config.label()
            result = verify(compile_kernel(kernel), problem)
            what = f"{problem.describe()} {kernel.config.label()}"
            if not result.ok:
                failures.append(f"{what}: {result.summary()}")
            elif dtype == "float32":
                for name, error in result.errors.items():
                    if name.startswith("offset/") and error.rel_l2 > 1e-5:
                        failures.append(f"{what}: {name} {error.rel_l2:.1e}")
    finally:
        pool.close()
    assert not failures, "\n".join(failures)
