"""GPU: where nothing is tuned, what dispatch runs verifies, and spills only where it must.

nvcc 13.0 spills the defaults of LayerNorm after the add at 16-bit 32768 and 65536 (4 bytes at
168 registers, sm_90) and of the 16-bit backwards holding odd rows in registers (7001, 9001);
on the GPU the runtime compiler decides. Each shape below is dispatched with no database. What
runs must pass float64 verification. Where the default's own kernel spills here, dispatch runs
a leaner pick that keeps its row cache and does not spill, or, where there is none, the default
(:mod:`autonorm.fallback`); where it does not spill, the default.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

SHAPES = [
    ("layer_norm", {"residual": True}, "bfloat16", 32768, 64),
    ("layer_norm", {"residual": True}, "bfloat16", 65536, 64),
    ("layer_norm_backward", {}, "bfloat16", 9001, 7455),
    ("rms_norm_backward", {}, "bfloat16", 7001, 9585),
    ("layer_norm_backward", {"residual": True}, "float32", 7001, 9585),
    ("layer_norm_backward", {"has_weight": False, "has_bias": False}, "bfloat16", 16384, 4096),
]


@pytest.fixture
def no_tuning(tmp_path, monkeypatch):
    """No user and no shipped database: every shape takes its default."""
    from autonorm import dispatch

    monkeypatch.setenv("AUTONORM_DB", str(tmp_path / "user.db"))
    monkeypatch.setenv("AUTONORM_NO_SHIPPED_DB", "1")
    dispatch.clear_cache()
    yield
    dispatch.clear_cache()


@pytest.mark.parametrize(("op", "form", "dtype", "hidden", "rows"), SHAPES,
                         ids=[f"{s[0]}-{s[2]}-{s[3]}-{'-'.join(s[1]) or 'plain'}" for s in SHAPES])
def test_what_dispatch_runs_verifies_and_spills_only_where_it_must(
    no_tuning, op, form, dtype, hidden, rows
):
    from autonorm import dispatch
    from autonorm.fallback import leaner_defaults
    from autonorm.ops import registry
    from autonorm.ops.layer_norm.verify import verify as verify_forward
    from autonorm.ops.norm_backward.verify import verify as verify_backward
    from autonorm.runtime import compiler
    from autonorm.runtime.device import query_device

    family = registry.get(op)
    problem = family.problem(hidden=hidden, dtype=dtype, **form)
    limits = query_device().limits()
    default = family.default(problem, limits, rows)
    own = compiler.compile_kernel(family.render(default, problem, limits))
    kernel = dispatch.get_kernel(problem, rows)
    choice = dispatch.chosen(problem, rows)
    assert choice.source == "default"
    if not compiler.local_bytes(own):
        assert choice.config == default
    elif choice.config != default:
        assert compiler.local_bytes(kernel) == 0, choice.config.label()
        assert choice.config.cache == default.cache
        assert choice.config in list(leaner_defaults(problem, limits, rows, default))
    verify = verify_backward if op.endswith("_backward") else verify_forward
    result = verify(kernel, problem)
    assert result.ok, result.summary()


SPILLING = [s for s in SHAPES if s[0].endswith("_backward") and s[3] % 8]


@pytest.mark.parametrize(("op", "form", "dtype", "hidden", "rows"), SPILLING,
                         ids=[f"{s[0]}-{s[2]}-{s[3]}" for s in SPILLING])
def test_the_tuner_times_a_default_that_spills(no_tuning, op, form, dtype, hidden, rows):
    """The tuner's evaluator verifies and times a default that spills here, so it can defend.

    Refused, it could not: the search would store a spill-free winner slower than the default
    that dispatch ran before (2.4-4.5x at these shapes on the H200).
    """
    from autonorm.ops import registry
    from autonorm.runtime import compiler
    from autonorm.runtime.device import query_device
    from autonorm.tune.evaluator import GpuEvaluator
    from autonorm.tune.evaluator_process import close_evaluator

    family = registry.get(op)
    problem = family.problem(hidden=hidden, dtype=dtype, **form)
    default = family.default(problem, query_device().limits(), rows)
    evaluator = GpuEvaluator(problem, rows)
    try:
        spilled = compiler.local_bytes(evaluator._compile(default))
        outcome = evaluator.evaluate(default)
    finally:
        close_evaluator(evaluator)
    if not spilled:
        pytest.skip(f"{default.label()} does not spill on this GPU")
    assert outcome.ok, outcome.error
    assert outcome.timing.median_us > 0
