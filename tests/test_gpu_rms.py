"""GPU: RMSNorm kernels verify against float64 across the template's branches, and break.

RMSNorm runs LayerNorm's row and bulk-copy kernels with the mean-of-squares statistic
(:mod:`autonorm.ops.rms_norm`). A fixed-seed cover of the branches those kernels take (caches,
rows per block, clusters, the bulk-copy engine, skewed rows, every weight form) is verified on
LayerNorm's cases; fp32 stays within 1e-6 of float64 on rows of mean 1000 and spread 0.1; and
broken RMS kernels (a wrong mean of squares, Gemma's offset dropped, a skewed row's pads
counted, h left unstored) must fail the verifier. The residual add's in-place form (vLLM's:
the residual becomes h, x becomes y) gives the functional form's bits.
"""

from __future__ import annotations

import itertools
import random

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
from autonorm.ops.rms_norm.problem import Problem

pytestmark = pytest.mark.gpu

FAMILY = registry.get("rms_norm")
HIDDEN = (1, 3, 100, 768, 1000, 4096, 4097, 4099, 16384, 65536)
FORMS = ((True, False), (True, True), (False, False))  # (has_weight, weight_offset)
PICKS = 3  # branches verified per hidden size, dtype and residual add, beyond the default


def cover(dtype: str, limits) -> list[tuple[Problem, KernelConfig]]:  # noqa: ANN001
    """The default and PICKS configurations of distinct branches per hidden size, the weight
    forms taken in turn (fixed seed)."""
    rng = random.Random(f"gpu-rms-{dtype}")
    work, turn = [], 0
    for hidden, residual in itertools.product(HIDDEN, (False, True)):
        base = Problem(hidden, dtype, residual=residual)
        picks = [FAMILY.default(base, limits, 4096)]
        picks += branch_picks(FAMILY, base, limits, rng, PICKS)
        for cfg in picks:
            has_weight, woff = FORMS[turn % len(FORMS)]
            turn += 1
            work.append((Problem(hidden, dtype, has_weight, woff, residual), cfg))
    return work


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_kernels_verify_across_branches(compiled, dtype: str) -> None:  # noqa: F811
    limits = compiled.limits
    work = [(problem, FAMILY.render(cfg, problem, limits)) for problem, cfg in cover(dtype, limits)]
    caches = {r.config.cache for _, r in work}
    assert {"registers", "smem", "bulk"} <= caches, caches
    assert sum(p.residual for p, _ in work) >= 20
    verify_all(compiled, work)
    print(f"\n{dtype}: {len(work)} RMSNorm kernels verified")


# fp32 rows of mean 1000 and spread 0.1: the row kernel (even and skewed), the bulk kernel
# and a cluster's merged sum of squares.
OFFSET_CONFIGS = (
    (1000, KernelConfig(256, 4, 2, "registers", "two_pass", 1, 0)),
    (4097, KernelConfig(256, 4, 1, "smem", "two_pass", 1, 0)),
    (16384, KernelConfig(512, 4, 1, "bulk", "two_pass", 1, 0, stages=2)),
    (65536, KernelConfig(512, 4, 1, "bulk", "two_pass", 4, 0, stages=2)),
)


@pytest.mark.parametrize(("hidden", "config"), OFFSET_CONFIGS, ids=lambda v: str(v)[:12])
def test_fp32_offset_rows_stay_within_1e6(compiled, hidden: int, config) -> None:  # noqa: F811, ANN001
    problem = Problem(hidden, "float32")
    assert not FAMILY.check(config, problem, compiled.limits), config.label()
    result = verify_offset_rows(compiled, problem,
                                FAMILY.render(config, problem, compiled.limits))
    print(f"\nfp32 {hidden} {config.label()}: offset {result.errors['offset'].rel_l2:.1e}")


# One broken RMS kernel per way its arithmetic could go wrong: (hidden, weight_offset, text,
# replacement).
BREAKS = {
    # the mean of squares off by 10% (a wrong count, or eps where the mean belongs)
    "mean-of-squares": (4096, False, "const float var = s2 * INV_N;",
                        "const float var = s2 * INV_N * 1.1f;"),
    # Gemma's 1 + weight read as the weight
    "offset-dropped": (4096, True, "(1.f + elem(wv, k))", "elem(wv, k)"),
    # a skewed row's pads (its first element) enter the sum of squares
    "pads-counted": (4099, False, "if (!in_row(j * V - h + k)) continue;", ""),
    # the residual sum normalized but never stored as h
    "h-unstored": (4096, False, "  store_vec(p, hv);", ""),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(BREAKS))
def test_a_broken_rms_kernel_is_rejected(compiled, dtype: str, name: str) -> None:  # noqa: F811
    hidden, woff, old, new = BREAKS[name]
    if name == "pads-counted" and dtype == "float32":
        hidden = 4097  # odd for fp32's 4-element vector too
    problem = Problem(hidden, dtype, weight_offset=woff, residual=name == "h-unstored")
    config = KernelConfig(256, problem.max_vec, 1, "smem", "two_pass", 1, 0)
    rendered = FAMILY.render(config, problem, compiled.limits)
    assert_break_rejected(compiled, problem, rendered, old, new, name)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_in_place_residual_add_gives_the_functional_bits(compiled, dtype: str) -> None:  # noqa: F811
    import cupy

    from autonorm.numerics import from_float64

    limits = compiled.limits
    rng = __import__("numpy").random.default_rng(7)
    for hidden in (4096, 4099, 16384):  # 16384 at 300 rows: the bulk-copy kernel
        problem = Problem(hidden, dtype, residual=True)
        for config in (FAMILY.default(problem, limits, 300),
                       KernelConfig(256, problem.max_vec, 1, "smem", "two_pass", 1, 0)):
            kernel = compiled(FAMILY.render(config, problem, limits))
            x = cupy.asarray(from_float64(rng.standard_normal((300, hidden)), dtype))
            r = cupy.asarray(from_float64(rng.standard_normal((300, hidden)), dtype))
            w = cupy.asarray(from_float64(1 + 0.1 * rng.standard_normal(hidden), dtype))
            y, h = cupy.empty_like(x), cupy.empty_like(x)
            kernel.launch_arrays(x, r, w, None, y, h, 300, 1e-6)
            xi, ri = x.copy(), r.copy()
            kernel.launch_arrays(xi, ri, w, None, xi, ri, 300, 1e-6)  # vLLM's in-place form
            cupy.cuda.get_current_stream().synchronize()
            assert bool((xi.view(cupy.uint8) == y.view(cupy.uint8)).all()), config.label()
            assert bool((ri.view(cupy.uint8) == h.view(cupy.uint8)).all()), config.label()


# Rows past one block's row cache: the default splits them over a cluster that holds the row in
# shared memory (odd rows unevenly, blocks of 512 threads) where the row fits the cluster's, else
# reads x again to normalize (cache "none"). fp32 holds the offset rows to 1e-6.
LONG_ROWS = ((65535, "float32", "smem"), (262145, "float32", "smem"),
             (131071, "bfloat16", "smem"), (1048576, "float16", "none"))


@pytest.mark.parametrize(("hidden", "dtype", "cache"), LONG_ROWS)
def test_rows_past_one_blocks_cache_take_a_default_that_verifies(compiled, hidden: int,  # noqa: F811
                                                                  dtype: str, cache: str) -> None:
    work = []
    for has_weight, woff in FORMS:
        problem = Problem(hidden, dtype, has_weight, woff)
        config = FAMILY.default(problem, compiled.limits, 64)
        assert config.cache == cache and (config.cluster > 1) == (cache == "smem"), config.label()
        work.append((problem, FAMILY.render(config, problem, compiled.limits)))
    verify_all(compiled, work)
    if dtype == "float32":
        verify_offset_rows(compiled, *work[0])
