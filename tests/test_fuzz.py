"""Fuzzing the space, the renderer and the compiler with Hypothesis.

CPU: random problems (hidden 1..70000, every dtype and affine variant) and random points of the
raw space. :func:`autonorm.ops.layer_norm.rules.check` decides; the renderer must reject exactly
what it rejects, and render what it accepts, deterministically. The accepted kernels are then
compiled together by one nvcc run for sm_90 (skipped without nvcc).

GPU (marked ``gpu``): random problems (hidden 1..20000) and random valid configurations are
compiled with NVRTC and verified against the float64 reference.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from autonorm.codegen.kernel import RenderedKernel
from autonorm.dtypes import DTYPES
from autonorm.errors import ConfigError
from autonorm.ops import layer_norm as space
from autonorm.ops.layer_norm.codegen import render
from autonorm.ops.layer_norm.config import (
    BLOCKS_PER_SM,
    CACHES,
    CLUSTERS,
    ROWS_PER_BLOCK,
    STATS,
    THREADS,
    VECS,
    KernelConfig,
)
from autonorm.ops.layer_norm.problem import Problem
from autonorm.runtime.limits import H200
from autonorm.runtime.offline import compile_offline, nvcc_path

# Kernels compiled by the one nvcc run: about 4 s of nvcc for sm_90 on one core.
MAX_COMPILED = 40
# Random points of the raw space are valid about one time in fifteen: enough draws to collect
# MAX_COMPILED valid kernels, and the rejected ones are checked too.
CPU_EXAMPLES = 800
GPU_EXAMPLES = 25

# Accepted kernels by name, filled by the render fuzzer, compiled by the nvcc test. A kernel's
# name is unique per (config, problem), and one translation unit must not define it twice.
ACCEPTED: dict[str, RenderedKernel] = {}

# Examples are drawn afresh each run (no example database written into the checkout); a
# failure prints the seed to reproduce it.
FUZZ = settings(
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)


def problems(max_hidden: int) -> st.SearchStrategy[Problem]:
    """Problems of any hidden size up to ``max_hidden``; two draws in three are multiples of 8.

    Most random sizes admit only vec 1 (vec must divide hidden): multiples of 8 reach the
    16-byte vector paths, and those up to 8192 the register row cache.
    """
    hidden = st.one_of(
        st.integers(1, max_hidden),
        st.integers(1, max_hidden // 8).map(lambda k: 8 * k),
        st.integers(1, min(max_hidden, 8192) // 8).map(lambda k: 8 * k),
    )
    return st.builds(Problem, hidden, st.sampled_from(DTYPES), st.booleans(), st.booleans())


def raw_configs() -> st.SearchStrategy[KernelConfig]:
    """Any point of the raw space, valid or not."""
    return st.builds(
        KernelConfig,
        threads=st.sampled_from(THREADS),
        vec=st.sampled_from(VECS),
        rows_per_block=st.sampled_from(ROWS_PER_BLOCK),
        cache=st.sampled_from(CACHES),
        stats=st.sampled_from(STATS),
        cluster=st.sampled_from(CLUSTERS),
        blocks_per_sm=st.sampled_from(BLOCKS_PER_SM),
    )


@settings(FUZZ, max_examples=CPU_EXAMPLES)
@given(problem=problems(70000), config=raw_configs())
def test_render_accepts_exactly_what_check_accepts(problem: Problem, config: KernelConfig):
    reasons = space.check(config, problem, H200)
    if reasons:
        with pytest.raises(ConfigError) as info:
            render(config, problem, H200)
        assert str(info.value).endswith("; ".join(reasons))
        return
    rendered = render(config, problem, H200)
    assert render(config, problem, H200) == rendered  # deterministic, source included
    assert rendered.config == config and rendered.problem == problem
    assert f"\n{rendered.name}(const " in rendered.source
    assert f"__launch_bounds__({config.threads}, " in rendered.source
    assert ("__cluster_dims__" in rendered.source) == (config.cluster > 1)
    plan = rendered.launch
    assert plan.smem_bytes == space.smem_bytes(config, problem) <= H200.max_smem_optin
    for rows in (1, 37, 4096):
        grid = plan.grid(rows, H200.sm_count)
        assert grid >= plan.cluster and grid % plan.cluster == 0
        # Every row is covered: one tile per cluster, or a persistent grid that strides.
        assert config.blocks_per_sm or grid // plan.cluster * plan.rows_per_block >= rows
    if len(ACCEPTED) < MAX_COMPILED:
        ACCEPTED.setdefault(rendered.name, rendered)


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc not found on PATH (CI has it)")
def test_accepted_kernels_compile_with_nvcc():
    if len(ACCEPTED) < MAX_COMPILED // 2:  # run alone: fuzz here first
        test_render_accepts_exactly_what_check_accepts()
    kernels = list(ACCEPTED.values())
    assert len(kernels) >= MAX_COMPILED // 2, "the fuzzer found too few valid configurations"
    reports = compile_offline(kernels, "sm_90")
    for kernel in kernels:
        report = reports[kernel.name]
        assert 0 < report.registers <= 255
        # __launch_bounds__ holds: the block fits the register file.
        assert report.registers * kernel.config.threads <= H200.regs_per_sm, kernel.config


# --------------------------------------------------------------------------- on the GPU


@pytest.mark.gpu
# No shrinking: each example compiles with NVRTC, and the failure message names the kernel.
@settings(FUZZ, max_examples=GPU_EXAMPLES, phases=[Phase.generate])
@given(problem=problems(20000), data=st.data())
def test_random_valid_kernels_verify_on_the_gpu(problem: Problem, data: st.DataObject):
    from autonorm.ops.layer_norm.verify import verify
    from autonorm.runtime import compiler
    from autonorm.runtime.device import query_device

    limits = query_device().limits()
    candidates = space.enumerate_space(problem, limits)
    assert candidates, f"no valid configuration for {problem}"
    config = data.draw(st.sampled_from(candidates), label="config")
    kernel = compiler.compile_kernel(render(config, problem, limits))
    result = verify(kernel, problem)
    assert result.ok, f"{config.label()} on {problem}: {result.summary()}"
