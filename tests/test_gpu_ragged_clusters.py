"""GPU: the row kernel's clusters split rows the cluster does not divide, at every alignment.

A cluster of the row kernel deals each row's aligned vectors out in equal runs, the last block
taking the rest (:func:`autonorm.ops.layer_norm.shape.derive_shape`): rows whose vectors the
cluster does not divide, and skewed rows, which start off the vector grid (docs/kernels.md,
ragged clusters). Each hidden size here is verified against float64 on the verifier's 37-row
cases, where every offset a row can start at comes round, for LayerNorm and RMSNorm, with and
without the residual add (in place too), for each cache and statistic the kernel has; fp32 keeps
its 1e-6 on rows of mean 1000 and spread 0.1; and kernels broken in the ragged bookkeeping (a
skewed row's span counted without its skew, the last block's run taken whole, a block's element
offset or its weights taken as the first block's) must fail. (A skewed row's last block taking
a whole run is no such test: the row's masks keep its output right; the guard keeps its loads
inside the arrays.)
"""

from __future__ import annotations

import itertools

import pytest
from test_gpu_skew import (  # compiled: the fixture, compiling in a process pool
    assert_break_rejected,
    compiled,  # noqa: F401
    verify_all,
    verify_offset_rows,
)

from autonorm.dtypes import DTYPES, ITEMSIZE
from autonorm.ops import registry
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.heuristic import default_config
from autonorm.ops.layer_norm.plan import derive_plan
from autonorm.ops.layer_norm.rules import check

pytestmark = pytest.mark.gpu

LAYER = registry.get("layer_norm")
RMS = registry.get("rms_norm")

# Skewed (odd) sizes, and sizes on the vector grid that clusters of 4 and 8 do not divide into
# whole vectors (27656 = 8 x 3457: 3457 vectors of 16-bit, 6914 of fp32).
SKEWED = (1001, 4099, 26531)
UNEVEN = (1096, 27656)

# One broken ragged kernel per piece of its bookkeeping: (text, replacement), and the kernel it
# breaks: skewed rows (4099: registers, 128 threads, a cluster of 4) or rows on the grid that
# the cluster does not divide (27656: shared memory, 256 threads, a cluster of 8).
SKEWED_KERNEL = (4099, 128, "registers", 4)  # hidden, threads, cache, cluster
UNEVEN_KERNEL = (27656, 256, "smem", 8)
BREAKS = {
    # the blocks count a skewed row's vectors as if it started on the grid, so the last block
    # drops the vector the skew adds (the one holding the row's last elements, for some rows)
    "span-unskewed": ("const int nvr = min(NVEC, nv - crank * NVEC);",
                      "const int nvr = min(NVEC, (N + V - 1) / V - crank * NVEC);",
                      SKEWED_KERNEL),
    # each block indexes the row's elements as if its run were the first
    "offset-of-the-first-block": ("const int hl = h - crank * SEG;", "const int hl = h;",
                                  SKEWED_KERNEL),
    # each block takes the first block's weights
    "weights-of-the-first-block": ("load_shifted(wseg, j + crank * NVEC, h)",
                                   "load_shifted(wseg, j, h)", SKEWED_KERNEL),
    # the last block of a row on the grid takes a whole run: past the row's end
    "last-run-whole": ("const int nvr = min(NVEC, N / V - crank * NVEC);",
                       "const int nvr = NVEC;", UNEVEN_KERNEL),
}


def ragged_configs(family, problem, limits) -> list[KernelConfig]:  # noqa: ANN001
    """A ragged cluster configuration of ``problem`` for each cache, statistic and cluster size
    that ``check`` admits one for: the widest block of 256 threads down to 32."""
    stats = ("two_pass",) if problem.norm == "rms" else ("two_pass", "welford")
    picks = []
    for cache, stat, cluster in itertools.product(("registers", "smem"), stats, (2, 4, 8)):
        for threads in (256, 128, 64, 32):
            cfg = KernelConfig(threads, problem.max_vec, 1, cache, stat, cluster, 0)
            if not check(cfg, problem, limits) and derive_plan(cfg, problem, limits).shape.ragged:
                picks.append(cfg)
                break
    return picks


def _problems(dtype: str) -> list:
    out = []
    for hidden in (*SKEWED, *UNEVEN):
        if hidden in UNEVEN and hidden % (16 // ITEMSIZE[dtype]):
            continue
        out += [LAYER.problem(hidden=hidden, dtype=dtype), RMS.problem(hidden=hidden, dtype=dtype),
                LAYER.problem(hidden=hidden, dtype=dtype, residual=True),
                RMS.problem(hidden=hidden, dtype=dtype, residual=True)]
    return out


@pytest.mark.parametrize("dtype", DTYPES)
def test_ragged_clusters_verify_at_every_alignment(compiled, dtype: str) -> None:  # noqa: F811
    limits = compiled.limits
    work = []
    for problem in _problems(dtype):
        family = RMS if problem.norm == "rms" else LAYER
        configs = ragged_configs(family, problem, limits)
        assert configs, problem.describe()
        work += [(problem, family.render(cfg, problem, limits)) for cfg in configs]
    clusters = {r.config.cluster for _, r in work}
    assert clusters == {2, 4, 8}, clusters
    verify_all(compiled, work)
    print(f"\n{dtype}: {len(work)} ragged cluster kernels verified")


@pytest.mark.parametrize("hidden", (*SKEWED, *UNEVEN))
def test_fp32_offset_rows_stay_within_1e6_in_ragged_clusters(compiled, hidden: int) -> None:  # noqa: F811
    problem = LAYER.problem(hidden=hidden, dtype="float32")
    for cfg in ragged_configs(LAYER, problem, compiled.limits):
        verify_offset_rows(compiled, problem, LAYER.render(cfg, problem, compiled.limits))


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_in_place_residual_add_gives_the_functional_bits_in_ragged_clusters(
    compiled, dtype: str  # noqa: F811
) -> None:
    import cupy
    import numpy as np

    from autonorm.numerics import from_float64

    rng = np.random.default_rng(7)
    for family, hidden in itertools.product((LAYER, RMS), (4099, 27656)):
        problem = family.problem(hidden=hidden, dtype=dtype, residual=True)
        config = KernelConfig(256 if hidden > 8192 else 64, problem.max_vec, 1, "registers",
                              "two_pass", 8, 0)
        assert not check(config, problem, compiled.limits), config.label()
        assert derive_plan(config, problem, compiled.limits).shape.ragged
        kernel = compiled(family.render(config, problem, compiled.limits))
        x = cupy.asarray(from_float64(rng.standard_normal((37, hidden)), dtype))
        r = cupy.asarray(from_float64(rng.standard_normal((37, hidden)), dtype))
        w = cupy.asarray(from_float64(1 + 0.1 * rng.standard_normal(hidden), dtype))
        b = cupy.asarray(from_float64(0.1 * rng.standard_normal(hidden), dtype))
        bias = b if problem.norm == "layer" else None
        y, h = cupy.empty_like(x), cupy.empty_like(x)
        kernel.launch_arrays(x, r, w, bias, y, h, 37, 1e-6)
        xi, ri = x.copy(), r.copy()
        kernel.launch_arrays(xi, ri, w, bias, xi, ri, 37, 1e-6)  # vLLM's in-place form
        cupy.cuda.get_current_stream().synchronize()
        assert bool((xi.view(cupy.uint8) == y.view(cupy.uint8)).all()), problem.describe()
        assert bool((ri.view(cupy.uint8) == h.view(cupy.uint8)).all()), problem.describe()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(BREAKS))
def test_a_broken_ragged_kernel_is_rejected(compiled, dtype: str, name: str) -> None:  # noqa: F811
    old, new, (hidden, threads, cache, cluster) = BREAKS[name]
    problem = LAYER.problem(hidden=hidden, dtype=dtype)
    config = KernelConfig(threads, problem.max_vec, 1, cache, "two_pass", cluster, 0)
    assert not check(config, problem, compiled.limits), config.label()
    rendered = LAYER.render(config, problem, compiled.limits)
    assert_break_rejected(compiled, problem, rendered, old, new, name)


# Long rows on the vector grid at one row: the default splits them over a cluster of 8 row-kernel
# blocks (few_rows.ragged_latency_configs), fp32 LayerNorm at 512 threads where that leaves a
# thread two vectors and so one reduction (20004, 27656), the others at 256.
GRID_SIZES = {"float32": (12292, 20004, 27656), "float16": (27656, 49160),
              "bfloat16": (27656, 49160)}


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_few_row_defaults_of_long_rows_verify(compiled, dtype: str) -> None:  # noqa: F811
    limits = compiled.limits
    work = []
    for hidden, family, residual in itertools.product(GRID_SIZES[dtype], (LAYER, RMS),
                                                      (False, True)):
        problem = family.problem(hidden=hidden, dtype=dtype, residual=residual)
        cfg = default_config(problem, limits, 1)
        plan = derive_plan(cfg, problem, limits)
        assert cfg.cluster == 8 and plan.shape.ragged, (problem.describe(), cfg.label())
        work.append((problem, family.render(cfg, problem, limits)))
    threads = {r.config.threads for _, r in work}
    # fp32 20004 and 27656, 16-bit 49160 at 512 threads (few_rows._splits_at_512)
    assert threads == {256, 512}, threads
    verify_all(compiled, work)
    if dtype == "float32":
        for problem, rendered in work:
            if problem.norm == "layer" and not problem.residual:
                verify_offset_rows(compiled, problem, rendered)
    print(f"\n{dtype}: {len(work)} few-row defaults of long rows verified")
