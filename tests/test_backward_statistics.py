"""LayerNorm backward's one-pass statistics: where they hold, and a case where they do not.

The kernel sums d = x - shift (the row's first element), g, d^2 and d * g in one pass and one
reduction, and takes var = mean(d^2) - cmean^2 where cmean^2 <= SHIFT_NEAR * var; other rows
sum about the mean in a second pass. These checks emulate the kernel's fp32 order (a chain of
16 elements a thread, then the threads' sums) in NumPy: within the bound the one-pass variance
keeps fp32's accuracy, and on the verification case whose shifts lie far from the mean it does
not, so that case fails a kernel without the second pass (tests/test_gpu_backward.py plants
one). CPU only.
"""

from __future__ import annotations

import numpy as np
import pytest

from autonorm.ops import registry
from autonorm.ops.norm_backward.cases import make_cases
from autonorm.ops.norm_backward.plan import SHIFT_NEAR

HIDDEN = 4096
CHAIN = 16  # elements a thread sums in sequence (256 threads of 16 at hidden 4096)


def _case(dtype: str, name: str) -> np.ndarray:
    family = registry.get("layer_norm_backward")
    problem = family.problem(hidden=HIDDEN, dtype=dtype)
    # As the kernel reads it: rounded to the dtype (bfloat16, which NumPy lacks, to fp32).
    x = {case.name: case for case in make_cases(problem)}[name].x
    return x.astype(np.float32 if dtype == "bfloat16" else dtype)


def _one_pass(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The mean less the shift and the one-pass variance, in the kernel's fp32 order."""
    f32 = np.float32
    d = (x - x[:, :1]).astype(f32).reshape(len(x), -1, CHAIN)

    def total(a: np.ndarray) -> np.ndarray:
        acc = np.zeros(a.shape[:2], f32)
        for k in range(CHAIN):
            acc = acc + a[:, :, k]
        return acc.sum(axis=1, dtype=f32)

    cmean = total(d) / f32(HIDDEN)
    return cmean, total(d * d) / f32(HIDDEN) - cmean * cmean


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_the_far_shift_case_sends_every_other_row_to_the_second_pass(dtype: str) -> None:
    x = _case(dtype, "offset-far-shift").astype(np.float64)
    cmean = (x - x[:, :1]).mean(axis=1)
    far = cmean**2 > SHIFT_NEAR * x.var(axis=1)
    assert far[::2].all()
    assert not far[1::2].all()


def test_one_pass_variance_holds_within_the_bound_and_fails_past_it() -> None:
    for name in ("offset", "offset-far-shift"):
        x = _case("float32", name)
        cmean, var = _one_pass(x)
        true = x.astype(np.float64).var(axis=1)
        err = np.abs(var - true) / true
        near = cmean.astype(np.float64) ** 2 <= SHIFT_NEAR * var
        assert near.any()
        assert err[near].max() <= 1e-6, (name, err[near].max())
        if name == "offset-far-shift":
            assert (~near).sum() >= len(x) // 2
            assert err[~near].min() > 1e-5, err[~near].min()
