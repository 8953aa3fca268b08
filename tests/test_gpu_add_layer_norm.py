"""GPU: LayerNorm after the fused residual add verifies across the kernels' branches, and breaks.

The residual add (``h = x + residual`` rounded once, then LayerNorm of that h) runs in the row
kernel's register and shared-memory caches and in the bulk-copy kernel, which stages the
residual's tile beside x's. A fixed-seed cover of their branches is verified against float64
(h bit for bit); fp32 stays within 1e-6 on rows of mean 1000 and spread 0.1 with h as the shift;
kernels whose sum drops the residual fail the verifier; the in-place form gives the functional
form's bits; and :func:`autonorm.add_layer_norm` on CuPy arrays matches the NumPy path.
"""

from __future__ import annotations

import dataclasses
import itertools
import random

import numpy as np
import pytest
from test_compile_offline import branch_picks
from test_gpu_skew import (  # compiled: the fixture, compiling in a process pool
    assert_break_rejected,
    compiled,  # noqa: F401
    verify_all,
    verify_offset_rows,
)

from autonorm.dtypes import DTYPES
from autonorm.ops import registry
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.rules import check

pytestmark = pytest.mark.gpu

FAMILY = registry.get("layer_norm")
HIDDEN = (1, 3, 100, 768, 1000, 4096, 4097, 4099, 16384, 65536)
AFFINE = ((True, True), (True, False), (False, False))  # (has_weight, has_bias)
PICKS = 3  # branches verified per hidden size and dtype, beyond the defaults


def cover(dtype: str, limits) -> list[tuple[Problem, KernelConfig]]:  # noqa: ANN001
    """The defaults at 64 and 4,096 rows and PICKS configurations of distinct branches per
    hidden size, the affine flags taken in turn (fixed seed)."""
    rng = random.Random(f"gpu-add-ln-{dtype}")
    work, turn = [], 0
    for hidden in HIDDEN:
        base = Problem(hidden, dtype, residual=True)
        picks = list(dict.fromkeys([FAMILY.default(base, limits, 64),
                                    FAMILY.default(base, limits, 4096)]))
        picks += branch_picks(FAMILY, base, limits, rng, PICKS)
        for cfg in picks:
            has_weight, has_bias = AFFINE[turn % len(AFFINE)]
            turn += 1
            work.append((Problem(hidden, dtype, has_weight, has_bias, residual=True), cfg))
    return work


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_layer_norm_kernels_verify_across_branches(compiled, dtype: str) -> None:  # noqa: F811
    limits = compiled.limits
    work = [(problem, FAMILY.render(cfg, problem, limits)) for problem, cfg in cover(dtype, limits)]
    caches = {r.config.cache for _, r in work}
    assert {"registers", "smem", "bulk"} <= caches, caches
    verify_all(compiled, work)
    print(f"\n{dtype}: {len(work)} residual LayerNorm kernels verified")


# fp32 rows of mean 1000 and spread 0.1: the row kernel (even and skewed), the bulk kernel and a
# cluster's merge of segments shifted by their first h.
OFFSET_CONFIGS = (
    (1000, KernelConfig(256, 4, 2, "registers", "two_pass", 1, 0)),
    (4097, KernelConfig(256, 4, 1, "smem", "two_pass", 1, 0)),
    (8192, KernelConfig(256, 4, 1, "bulk", "two_pass", 1, 0, stages=2)),
    (65536, KernelConfig(256, 4, 1, "bulk", "two_pass", 8, 0, stages=2)),
)


@pytest.mark.parametrize(("hidden", "config"), OFFSET_CONFIGS, ids=lambda v: str(v)[:12])
def test_fp32_offset_rows_stay_within_1e6(compiled, hidden: int, config) -> None:  # noqa: F811, ANN001
    problem = Problem(hidden, "float32", residual=True)
    assert not FAMILY.check(config, problem, compiled.limits), config.label()
    result = verify_offset_rows(compiled, problem,
                                FAMILY.render(config, problem, compiled.limits))
    print(f"\nfp32 {hidden} {config.label()}: offset {result.errors['offset'].rel_l2:.1e}")


# Kernels whose sum drops the residual (h = x): the row kernel's cache fill and the bulk
# kernel's staged add.
BREAKS = {
    "row": (KernelConfig(256, 8, 1, "smem", "two_pass", 1, 0), 4096,
            "o[k] = elem(a, k) + elem(b, k);", "o[k] = elem(a, k);"),
    "bulk": (KernelConfig(512, 8, 1, "bulk", "two_pass", 1, 0, stages=1), 16384,
             "o[q] = elem(xv, q) + elem(rv, q);", "o[q] = elem(xv, q);"),
}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", sorted(BREAKS))
def test_a_kernel_that_drops_the_residual_is_rejected(compiled, dtype: str, name: str) -> None:  # noqa: F811
    config, hidden, old, new = BREAKS[name]
    problem = Problem(hidden, dtype, residual=True)
    config = dataclasses.replace(config, vec=problem.max_vec)
    rendered = FAMILY.render(config, problem, compiled.limits)
    assert_break_rejected(compiled, problem, rendered, old, new, name)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_in_place_form_gives_the_functional_bits(compiled, dtype: str) -> None:  # noqa: F811
    import cupy

    from autonorm.numerics import from_float64

    limits = compiled.limits
    rng = np.random.default_rng(11)
    for hidden in (4096, 4099, 16384):  # 16384 at 300 rows: the bulk-copy kernel
        problem = Problem(hidden, dtype, residual=True)
        config = FAMILY.default(problem, limits, 300)
        kernel = compiled(FAMILY.render(config, problem, limits))
        x = cupy.asarray(from_float64(rng.standard_normal((300, hidden)), dtype))
        r = cupy.asarray(from_float64(rng.standard_normal((300, hidden)), dtype))
        w = cupy.asarray(from_float64(1 + 0.1 * rng.standard_normal(hidden), dtype))
        b = cupy.asarray(from_float64(0.1 * rng.standard_normal(hidden), dtype))
        y, h = cupy.empty_like(x), cupy.empty_like(x)
        kernel.launch_arrays(x, r, w, b, y, h, 300, 1e-5)
        xi, ri = x.copy(), r.copy()
        kernel.launch_arrays(xi, ri, w, b, xi, ri, 300, 1e-5)
        cupy.cuda.get_current_stream().synchronize()
        assert bool((xi.view(cupy.uint8) == y.view(cupy.uint8)).all()), config.label()
        assert bool((ri.view(cupy.uint8) == h.view(cupy.uint8)).all()), config.label()


# Row kernels of several shapes: warps of one row (smem, registers), rows of a sub-warp each, a
# row over a cluster, and a skewed row.
IN_PLACE_ROW_KERNELS = [
    (4096, KernelConfig(128, 8, 1, "smem", "two_pass", 1, 0)),
    (4096, KernelConfig(512, 8, 1, "registers", "two_pass", 1, 0)),
    (512, KernelConfig(128, 8, 8, "registers", "two_pass", 1, 0)),
    (8192, KernelConfig(256, 8, 1, "registers", "two_pass", 2, 0)),
    (4099, KernelConfig(256, 8, 1, "smem", "two_pass", 1, 0)),
]


@pytest.mark.parametrize("residual_dtype", [None, "float32"])
def test_in_place_row_kernels_read_the_shift_before_h_overwrites_it(
        compiled, residual_dtype: str | None) -> None:  # noqa: F811
    """In place, h is stored over the residual as the row is cached; the shift (h's first
    element, read from global memory) must be read by every thread before that store."""
    import cupy

    from autonorm.numerics import from_float64

    limits, rng = compiled.limits, np.random.default_rng(12)
    for hidden, config in IN_PLACE_ROW_KERNELS:
        problem = Problem(hidden, "bfloat16", residual=True, residual_dtype=residual_dtype)
        if check(config, problem, limits):
            assert residual_dtype and hidden % 8, config.label()  # only the wide skewed row
            continue
        kernel = compiled(FAMILY.render(config, problem, limits))
        rows = 4
        x = cupy.asarray(from_float64(rng.standard_normal((rows, hidden)), "bfloat16"))
        # A residual far from zero: a shift read after the store would be off by x's element.
        r64 = 100 + rng.standard_normal((rows, hidden))
        r = cupy.asarray(from_float64(r64, problem.h_dtype))
        w = cupy.asarray(from_float64(1 + 0.1 * rng.standard_normal(hidden), "bfloat16"))
        b = cupy.asarray(from_float64(0.1 * rng.standard_normal(hidden), "bfloat16"))
        y, h = cupy.empty_like(x), cupy.empty_like(r)
        kernel.launch_arrays(x, r, w, b, y, h, rows, 1e-5)
        xi, ri = x.copy(), r.copy()
        kernel.launch_arrays(xi, ri, w, b, xi, ri, rows, 1e-5)
        cupy.cuda.get_current_stream().synchronize()
        assert bool((xi.view(cupy.uint8) == y.view(cupy.uint8)).all()), config.label()
        assert bool((ri.view(cupy.uint8) == h.view(cupy.uint8)).all()), config.label()


@pytest.mark.parametrize(
    ("hidden", "rows"), list(itertools.product((1000, 4096, 16384), (1, 300)))
)
def test_add_layer_norm_on_cupy_matches_the_numpy_path(tmp_path, monkeypatch, hidden, rows):
    import cupy

    import autonorm

    monkeypatch.setenv("AUTONORM_DB", str(tmp_path / "user.db"))
    rng = np.random.default_rng(hidden + rows)
    x = rng.standard_normal((rows, hidden)).astype(np.float32) + 5
    r = rng.standard_normal((rows, hidden)).astype(np.float32)
    w = (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32)
    b = (0.1 * rng.standard_normal(hidden)).astype(np.float32)
    y_ref, h_ref = autonorm.add_layer_norm(x, r, w, b, 1e-5)
    y, h = autonorm.add_layer_norm(*(cupy.asarray(a) for a in (x, r, w, b)), 1e-5)
    assert np.array_equal(cupy.asnumpy(h), h_ref)
    err = np.abs(cupy.asnumpy(y).astype(np.float64) - y_ref).max()
    assert err <= 1e-5, err
    xi, ri = cupy.asarray(x), cupy.asarray(r)
    autonorm.add_layer_norm(xi, ri, cupy.asarray(w), cupy.asarray(b), 1e-5, in_place=True)
    assert cupy.array_equal(xi, y) and cupy.array_equal(ri, h)
