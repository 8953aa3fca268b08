"""GPU: where nothing is tuned, dispatch runs a kernel that does not spill, and it verifies.

nvcc 13.0 spills the defaults of LayerNorm after the add at 16-bit 32768 and 65536 (4 bytes at
168 registers, sm_90) and of 16-bit LayerNorm backward holding 4096-16384 elements in
registers; on the GPU the runtime compiler decides. Each shape below is dispatched with no
database: the kernel it runs must use no local memory and pass float64 verification, and where
the default's own kernel spills here, dispatch must have run another (:mod:`autonorm.fallback`).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

SHAPES = [
    ("layer_norm", {"residual": True}, "bfloat16", 32768, 64),
    ("layer_norm", {"residual": True}, "bfloat16", 65536, 64),
    ("layer_norm", {"residual": True}, "float16", 65536, 1024),
    ("layer_norm_backward", {}, "bfloat16", 12289, 5461),
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
def test_what_dispatch_runs_does_not_spill_and_verifies(no_tuning, op, form, dtype, hidden, rows):
    from autonorm import dispatch
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
    assert compiler.local_bytes(kernel) == 0, choice.config.label()
    if compiler.local_bytes(own):
        assert choice.config != default
    else:
        assert choice.config == default
    verify = verify_backward if op.endswith("_backward") else verify_forward
    result = verify(kernel, problem)
    assert result.ok, result.summary()
