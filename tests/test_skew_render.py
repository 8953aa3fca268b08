"""Skewed rows on the CPU: the broken variants of tests/test_gpu_skew.py (and of the few-row
kernels' early weight loads, tests/test_gpu_few_rows.py) patch real code.

Each patch must change its kernel exactly once, so the GPU test's rejections are of the faults
they name; and a skewed kernel must carry the skewed paths while an aligned one carries none.
"""

from __future__ import annotations

import pytest
from test_gpu_few_rows import BREAKS as EARLY_BREAKS
from test_gpu_skew import BREAKS

from autonorm.dtypes import DTYPES
from autonorm.ops.layer_norm.codegen import render
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.heuristic import few_rows_config
from autonorm.ops.layer_norm.problem import Problem
from autonorm.runtime.limits import H200


def _kernel(problem: Problem) -> str:
    return render(KernelConfig(256, problem.max_vec, 1, "smem", "two_pass", 1, 0), problem,
                  H200).source


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(BREAKS))
def test_every_skew_patch_changes_its_kernel_once(dtype: str, name: str) -> None:
    source = _kernel(Problem(4099 if dtype != "float32" else 4097, dtype))
    old, new = BREAKS[name]
    assert source.count(old) == 1, name
    assert source.replace(old, new) != source


@pytest.mark.parametrize("dtype", DTYPES)
def test_only_skewed_rows_render_the_skewed_paths(dtype: str) -> None:
    skewed = _kernel(Problem(4099 if dtype != "float32" else 4097, dtype))
    aligned = _kernel(Problem(4096, dtype))
    for piece in ("load_shifted(wseg, j, h)", "store_row(yr", "pad_out(", "in_row("):
        assert piece in skewed and piece not in aligned, piece


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(EARLY_BREAKS))
def test_every_early_weights_patch_changes_its_kernel_once(dtype: str, name: str) -> None:
    problem = Problem(1072 if name == "weights-from-bias" else 1001, dtype)
    source = render(few_rows_config(problem, 1), problem, H200).source
    old, new = EARLY_BREAKS[name]
    assert source.count(old) == 1, name
    assert source.replace(old, new) != source
