"""The clustered row kernel's y and h leave as whole vectors; its cached row stays in shared memory.

With the block's column offset in the address, nvcc 13.0 split a clustered block's plain 16-byte
store into 2- and 4-byte stores (docs/kernels.md, clusters), so the template writes y and h to
global memory in PTX (``store_out``). That store names the global state space, so the row a
shared-memory kernel caches must keep its own stores: a global store to a shared address ends
the launch with ``cudaErrorInvalidAddressSpace``. Both are read from the PTX nvcc writes for
sm_90. No GPU; skipped where nvcc is not installed (CI installs it).
"""

from __future__ import annotations

import re

import pytest
from test_compile_offline import ptx_of, requires_nvcc

from autonorm.ops import registry
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.runtime.limits import H200

HIDDEN = 16384  # every row starts on the 16-byte grid: no skewed row, so no element stores
# A global store narrower than a vector: y or h split into elements or words.
NARROW = re.compile(r"\bst\.global(?:\.[a-z]+)*\.(?:u8|u16|u32|b16|b32|f16|bf16|f32)\b")
WHOLE = re.compile(r"\bst\.global(?:\.[a-z]+)*\.v[24]\.")
SHARED_VEC = re.compile(r"\bst\.shared(?:\.[a-z]+)*\.v4\.")  # a 16-byte vector of the row
CASES = [
    (op, dtype, residual, cache)
    for op in ("layer_norm", "rms_norm")
    for dtype in ("bfloat16", "float32")
    for residual in (False, True)
    for cache in ("registers", "smem")
]


def stores(op: str, dtype: str, residual: bool, cache: str) -> str:
    """PTX of the row kernel of a cluster of 4 blocks for one problem at HIDDEN."""
    family = registry.get(op)
    problem = family.problem(hidden=HIDDEN, dtype=dtype, residual=residual)
    config = KernelConfig(256, problem.full_vec, 1, cache, "two_pass", 4, 0, 0)
    return ptx_of(family.render(config, problem, H200).source)


@requires_nvcc
@pytest.mark.parametrize(("op", "dtype", "residual", "cache"), CASES,
                         ids=["-".join(map(str, case)) for case in CASES])
def test_clustered_row_kernels_store_whole_vectors(op, dtype, residual, cache) -> None:  # noqa: ANN001
    ptx = stores(op, dtype, residual, cache)
    assert not NARROW.findall(ptx), sorted(set(NARROW.findall(ptx)))
    # y alone, or y and h: one whole store per vector a thread holds of each.
    per_output = HIDDEN // 4 // 256 // (8 if dtype == "bfloat16" else 4)
    assert len(WHOLE.findall(ptx)) == per_output * (2 if residual else 1)
    if cache == "smem":
        # The cached row (x, or h after the add): each of its vectors written to shared memory.
        assert len(SHARED_VEC.findall(ptx)) == per_output
