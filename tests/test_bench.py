"""The timing protocol's pure parts (no GPU): the bytes a problem moves, its reference copy."""

from __future__ import annotations

import pytest

from autonorm.ops.layer_norm.family import FAMILY
from autonorm.ops.layer_norm.problem import Problem
from autonorm.runtime import timing as bench


def _bytes_moved(rows: int, hidden: int, dtype: str, affine: bool) -> int:
    return FAMILY.bytes_moved(Problem(hidden, dtype, affine, affine), rows)


def test_bytes_moved_counts_x_y_and_each_affine_tensor_once() -> None:
    assert _bytes_moved(4096, 16384, "bfloat16", True) == 2 * 4096 * 16384 * 2 + 2 * 16384 * 2
    assert _bytes_moved(4096, 16384, "float32", False) == 2 * 4096 * 16384 * 4


@pytest.mark.parametrize(("hidden", "dtype"), [(768, "bfloat16"), (1024, "float16"),
                                               (2048, "bfloat16"), (768, "float32"),
                                               (1024, "float32"), (16384, "float32")])
def test_reference_copy_of_the_grid_is_x_alone(hidden: int, dtype: str) -> None:
    # 2^26 elements: x is 2^27 or 2^28 bytes; weight and bias (a few KiB) must not set the
    # copy's size, where cudaMemcpy ran 2-5% slower (docs/timing.md).
    rows = (1 << 26) // hidden
    nbytes = _bytes_moved(rows, hidden, dtype, True)
    itemsize = 4 if dtype == "float32" else 2
    assert bench.copy_buffer_bytes(nbytes) == (1 << 26) * itemsize


def test_reference_copy_is_whole_mebibytes_within_half_a_mebibyte() -> None:
    mib = bench.COPY_ROUND_BYTES
    for nbytes in (2 * 5461 * 12288 * 2 + 4 * 12288, 3 * mib + 17, 123_456_789):
        size = bench.copy_buffer_bytes(nbytes)
        assert size % mib == 0
        assert abs(size - nbytes // 2) <= mib // 2
    assert bench.copy_buffer_bytes(1000) == mib  # never an empty copy
