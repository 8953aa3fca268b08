"""GPU: backward kernels split over clusters of 16 blocks verify, and breaks in them fail.

Sixteen blocks is a non-portable cluster size, which Hopper launches once the kernel allows it
(``compile_kernel`` does). The kernels here cover its forms at hidden 65536: LayerNorm's
default there (fp32, the row held, sums in shared memory), sums in registers, a row read from
its stage in every pass with its sums met by lanes, and RMSNorm's held exchange by lanes, whose
two totals over 16 blocks take every lane of a warp. fp32 dx and dweight stay within 1e-5 of
float64 on offset rows, and two kernels with a planted break (the blocks' butterfly one level
short, the column sums over half the partial rows) must fail the verifier.
"""

from __future__ import annotations

import dataclasses

import pytest

from autonorm.ops import registry
from autonorm.ops.norm_backward.config import BackwardConfig
from autonorm.ops.norm_backward.verify import verify

pytestmark = pytest.mark.gpu

HIDDEN = 65536

# (op, dtype, configuration)
CASES = [
    ("layer_norm_backward", "float32",
     BackwardConfig(256, 4, "bulk", "smem", 2, stages=2, cluster=16, hold=True)),
    ("layer_norm_backward", "float32",
     BackwardConfig(256, 4, "bulk", "registers", 1, stages=2, cluster=16, hold=True)),
    ("layer_norm_backward", "bfloat16",
     BackwardConfig(512, 8, "bulk", "registers", 1, stages=2, cluster=16, lanes=True)),
    ("rms_norm_backward", "bfloat16",
     BackwardConfig(256, 8, "bulk", "registers", 2, stages=2, cluster=16, hold=True,
                    lanes=True)),
    ("rms_norm_backward", "float32",
     BackwardConfig(512, 4, "bulk", "registers", 1, stages=2, cluster=16, hold=True,
                    lanes=True)),
]

# The held exchange's butterfly over the blocks, RMSNorm's two totals a block: stopped at 8
# blocks, each lane ends with half the cluster's totals.
BLOCKS_BUTTERFLY = ("for (int o = 2; o < C * 2; o <<= 1)", "for (int o = 2; o < C; o <<= 1)")
# The final column sums over half the partial rows (the clusters that took rows).
HALF_PARTIALS = ("p < parts; p += NW", "p < (parts + 1) / 2; p += NW")


@pytest.fixture(scope="module")
def limits():  # noqa: ANN201
    from autonorm.runtime.device import query_device

    found = query_device(0).limits()
    if found.max_cluster_blocks < 16:
        pytest.skip(f"{found.name} launches clusters of at most {found.max_cluster_blocks}")
    return found


def _compiled(family, config, problem, limits, edit=None):  # noqa: ANN001, ANN202
    from autonorm.runtime.compiler import compile_kernel

    kernel = family.render(config, problem, limits)
    if edit is not None:
        old, new = edit
        assert old in kernel.source, (config.label(), old)
        kernel = dataclasses.replace(kernel, source=kernel.source.replace(old, new))
    return compile_kernel(kernel)


@pytest.mark.parametrize(("op", "dtype", "config"), CASES, ids=lambda v: getattr(v, "label",
                                                                                lambda: v)())
def test_clusters_of_sixteen_verify(op: str, dtype: str, config: BackwardConfig, limits) -> None:  # noqa: ANN001
    family = registry.get(op)
    problem = family.problem(hidden=HIDDEN, dtype=dtype)
    assert family.check(config, problem, limits) == []
    kernel = _compiled(family, config, problem, limits)
    assert kernel.plan.cluster == 16 and kernel.resident_clusters
    result = verify(kernel, problem)
    assert result.ok, (config.label(), result.summary())
    if dtype == "float32":
        for name in ("offset/dx", "offset/dweight"):
            assert result.errors[name].rel_l2 <= 1e-5, (name, result.errors[name])


def test_the_default_at_65536_fp32_is_a_cluster_of_sixteen(limits) -> None:  # noqa: ANN001
    family = registry.get("layer_norm_backward")
    problem = family.problem(hidden=HIDDEN, dtype="float32")
    assert family.default(problem, limits) == CASES[0][2]


@pytest.mark.parametrize(("case", "edit"), [(3, BLOCKS_BUTTERFLY), (0, HALF_PARTIALS)],
                         ids=["blocks-butterfly", "half-partials"])
def test_breaks_in_clusters_of_sixteen_fail(case: int, edit: tuple[str, str], limits) -> None:  # noqa: ANN001
    op, dtype, config = CASES[case]
    family = registry.get(op)
    problem = family.problem(hidden=HIDDEN, dtype=dtype)
    result = verify(_compiled(family, config, problem, limits, edit), problem)
    assert not result.ok, f"{config.label()} with {edit[1]!r} passed verification"
