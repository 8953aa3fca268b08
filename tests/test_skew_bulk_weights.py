"""A skewed bulk kernel joins its weight and bias once a launch, into shared memory.

Under the static schedule of a multiple of P blocks every row a thread normalizes starts at one
offset into the vector grid, so the thread's weight and bias vectors, shifted to that offset,
serve all of them. Where registers cannot hold them without a block less an SM, shared memory
holds them ([it][thread]) if that costs no block; otherwise each row joins them again from two
aligned vectors. CPU only: rendering, the plan, and nvcc offline.
"""

from __future__ import annotations

import itertools

import pytest

from autonorm.ops.layer_norm import plan as plan_module
from autonorm.ops.layer_norm.codegen import render
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.heuristic import default_config
from autonorm.ops.layer_norm.plan import derive_plan
from autonorm.ops.layer_norm.problem import Problem
from autonorm.runtime import offline
from autonorm.runtime.limits import H200

JOINED_EVERY_ROW = "const Vec wv = load_shifted(wseg, j, h);"


def _default(problem: Problem, rows: int):  # noqa: ANN202
    config = default_config(problem, H200, rows)
    assert config.cache == "bulk"
    return config


@pytest.mark.parametrize(("dtype", "hidden"), [("bfloat16", 4099), ("float16", 4099),
                                               ("float32", 4099), ("bfloat16", 12289)])
def test_the_weights_are_joined_once_into_shared_memory(dtype: str, hidden: int,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    problem = Problem(hidden, dtype)
    config = _default(problem, 2**26 // hidden)
    plan = derive_plan(config, problem, H200)
    assert plan.weights_in_smem and not plan.weights_in_registers
    source = render(config, problem, H200).source
    assert f"const Vec wv = wsm[it * {config.threads} + tid];" in source
    assert f"const Vec bv = bsm[it * {config.threads} + tid];" in source
    assert JOINED_EVERY_ROW not in source
    # At these shapes it costs no block an SM; the shared memory is the thread's vectors of both.
    monkeypatch.setattr(plan_module, "SKEWED_WEIGHTS_IN_SMEM", frozenset())
    joined = derive_plan(config, problem, H200)
    assert not joined.weights_in_smem
    assert plan.min_blocks == joined.min_blocks
    shape = plan.shape
    weights = 2 * shape.iters * config.threads * config.vec * problem.itemsize
    assert plan.smem_bytes == plan.weights_smem_offset + weights
    assert joined.smem_bytes <= plan.weights_smem_offset < joined.smem_bytes + 16
    assert JOINED_EVERY_ROW in render(config, problem, H200).source


def test_shared_memory_holds_them_even_at_a_block_less() -> None:
    # The residual add stages the residual's tile beside x's: the weights cost two blocks.
    problem = Problem(4099, "bfloat16", residual=True)
    config = _default(problem, 2**26 // 4099)
    plan = derive_plan(config, problem, H200)
    assert plan.weights_in_smem and not plan.weights_in_registers
    source = render(config, problem, H200).source
    assert f"const Vec wv = wsm[it * {config.threads} + tid];" in source


def test_where_they_do_not_fit_beside_the_stages_each_row_joins_them() -> None:
    # Eight stages of a 24 KB row leave no room for 48 KB of shifted weights.
    problem = Problem(12289, "bfloat16")
    config = KernelConfig(256, 8, 1, "bulk", "two_pass", 1, 0, 8)
    plan = derive_plan(config, problem, H200)
    assert plan.shape.skewed and not plan.weights_in_registers
    weights = 2 * plan.shape.iters * config.threads * config.vec * problem.itemsize
    assert -(-plan.smem_bytes // 16) * 16 + weights > H200.max_smem_optin
    assert not plan.weights_in_smem
    assert JOINED_EVERY_ROW in render(config, problem, H200).source


@pytest.mark.parametrize("hidden", [12288, 32768])
def test_aligned_rows_never_take_it(hidden: int) -> None:
    problem = Problem(hidden, "bfloat16")
    config = _default(problem, 2**26 // hidden)
    assert not derive_plan(config, problem, H200).weights_in_smem
    assert "wsm[" not in render(config, problem, H200).source


@pytest.mark.skipif(offline.nvcc_path() is None, reason="needs nvcc (CI installs it)")
def test_the_kernels_that_take_it_compile_without_spills() -> None:
    kernels = {}
    for dtype in ("bfloat16", "float16", "float32"):
        for hidden, residual in itertools.product((2053, 3556, 4099, 6151, 8191, 12289, 26531),
                                                  (False, True)):
            problem = Problem(hidden, dtype, residual=residual)
            for rows in (2**26 // hidden, 512):
                config = default_config(problem, H200, rows)
                if config.cache != "bulk" or not derive_plan(config, problem, H200).weights_in_smem:
                    continue
                kernel = render(config, problem, H200)
                kernels[kernel.name] = kernel
    assert len(kernels) >= 12
    reports = offline.compile_offline(list(kernels.values()))
    spilled = {name: r for name, r in reports.items() if r.spill_stores or r.spill_loads}
    assert not spilled


def test_every_broken_skewed_kernel_of_the_gpu_tests_finds_its_text() -> None:
    # The GPU tests break a kernel by replacing one text; a template change that drops the text
    # would leave them failing only on a GPU. Each text must occur once in the kernel it breaks.
    from test_gpu_skew import BREAKS, BULK_BREAKS, SMEM_BREAKS

    for dtype in ("bfloat16", "float16", "float32"):
        problem = Problem(4099 if dtype != "float32" else 4097, dtype)
        row = render(KernelConfig(256, problem.max_vec, 1, "smem", "two_pass", 1, 0), problem,
                     H200).source
        threads = 512 if dtype == "float32" else 256
        held = render(KernelConfig(threads, problem.max_vec, 1, "bulk", "two_pass", 1, 0, 2),
                      problem, H200).source
        config = _default(problem, 2**26 // problem.hidden)
        smem = render(config, problem, H200).source
        for source, breaks in ((row, BREAKS), (held, BULK_BREAKS), (smem, SMEM_BREAKS)):
            for name, (old, _) in breaks.items():
                text = old.format(threads=config.threads) if breaks is SMEM_BREAKS else old
                assert source.count(text) == 1, (dtype, name)


def test_rms_norm_keeps_its_per_row_joins_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    # RMSNorm shares the template but has not been timed with the weights in shared memory.
    from autonorm.ops import registry

    family = registry.get("rms_norm")
    for residual in (False, True):
        problem = family.problem(hidden=6151, dtype="bfloat16", residual=residual)
        config = family.default(problem, H200, 2**26 // 6151)
        plan = derive_plan(config, problem, H200)
        assert plan.shape.skewed and config.cache == "bulk"
        assert not plan.weights_in_smem
        assert "wsm[" not in family.render(config, problem, H200).source
        with monkeypatch.context() as patch:
            patch.setattr(plan_module, "SKEWED_WEIGHTS_IN_SMEM", frozenset({"layer", "rms"}))
            assert derive_plan(config, problem, H200).weights_in_smem
            source = family.render(config, problem, H200).source
            assert f"const Vec wv = wsm[it * {config.threads} + tid];" in source
            assert "bsm[" not in source  # RMSNorm has no bias
