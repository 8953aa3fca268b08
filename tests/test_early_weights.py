"""The ``early`` knob: weight and bias loaded beside x at 3-8 vectors a thread.

Its label, its rules, what it derives (early loads; fp32's lean math), the names of the kernels
without it (stored winners keep their digests), where the search asks for it and what the
rendered kernel does with it. The GPU side (the long-row defaults verify; a broken early load is
rejected) is tests/test_gpu_few_rows.py.
"""

from __future__ import annotations

import dataclasses

import pytest
from optuna.trial import FixedTrial

from autonorm.ops.layer_norm.codegen import kernel_name, render
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.family import FAMILY
from autonorm.ops.layer_norm.plan import EARLY_AFFINE_MAX_ITERS, derive_plan
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.rules import check
from autonorm.ops.rms_norm.problem import Problem as RmsProblem
from autonorm.runtime.limits import H200

# 4 vectors a thread of fp32 4096: past the two at which the loads move by themselves.
FOUR = KernelConfig(256, 4, 1, "registers", "two_pass", 1, 0, early=True)


def test_the_label_carries_early_and_parses_back():
    assert FOUR.label() == "t256v4r1-registers-two_pass-c1-p0-e"
    assert KernelConfig.from_label(FOUR.label()) == FOUR
    kept = dataclasses.replace(FOUR, keep_x=True)
    assert kept.label().endswith("-k-e")
    assert KernelConfig.from_label(kept.label()) == kept
    assert KernelConfig.from_dict(FOUR.to_dict()) == FOUR
    # Stored configurations from before the knob have no key: they are without it.
    old = {k: v for k, v in FOUR.to_dict().items() if k != "early"}
    assert KernelConfig.from_dict(old) == dataclasses.replace(FOUR, early=False)


def test_early_moves_the_loads_and_takes_the_lean_fp32_math():
    for problem in (Problem(4096, "float32"), RmsProblem(4096, "float32"),
                    RmsProblem(4096, "float32", residual=True)):
        plain = dataclasses.replace(FOUR, early=False)
        assert not derive_plan(plain, problem, H200).early_affine
        plan = derive_plan(FOUR, problem, H200)
        assert plan.early_affine and plan.lean_fp32 and plan.shape.iters == 4
        src = render(FOUR, problem, H200).source
        assert src.index("wpre[it] = load_vec(wseg") < src.index("__shfl_xor_sync")
        assert "rsqrtf(var + eps)" in src and "c2" not in src
        assert "wpre" not in render(plain, problem, H200).source
    # 16-bit: the loads move, the math stays IEEE
    bf16 = Problem(8192, "bfloat16")
    config = dataclasses.replace(FOUR, vec=8)
    plan = derive_plan(config, bf16, H200)
    assert plan.early_affine and not plan.lean_fp32
    assert "1.0f / sqrtf(var + eps)" in render(config, bf16, H200).source


def test_kernels_without_early_keep_their_names():
    problem = Problem(4096, "float32")
    plain = dataclasses.replace(FOUR, early=False)
    # The name this kernel had before `early` existed: stored winners keep their digests
    # (tests/test_shipped_kernels.py checks every shipped winner's).
    assert kernel_name(plain, problem) == "autonorm_ln_1880722f67840741"
    assert kernel_name(FOUR, problem) != kernel_name(plain, problem)


@pytest.mark.parametrize(("config", "problem", "reason"), [
    (dataclasses.replace(FOUR, cache="smem"), Problem(4096, "float32"), "register row cache"),
    (dataclasses.replace(FOUR, cluster=2), Problem(4096, "float32"), "cluster 1"),
    (dataclasses.replace(FOUR, blocks_per_sm=2), Problem(4096, "float32"), "persistent grid"),
    (dataclasses.replace(FOUR, vec=8, max_regs=64), Problem(8192, "bfloat16"), "register cap"),
    (dataclasses.replace(FOUR, vec=8),
     Problem(4096, "bfloat16", residual=True, residual_dtype="float32"), "float32 residual"),
    (FOUR, Problem(2048, "float32"), "already"),  # 2 vectors a thread
    (FOUR, RmsProblem(9 * 1024, "float32"), f"at most {EARLY_AFFINE_MAX_ITERS}"),  # 9 vectors
])
def test_early_is_refused_where_it_cannot_go_or_changes_nothing(config, problem, reason):
    reasons = check(config, problem, H200)
    assert any(reason in r for r in reasons), reasons


def test_early_runs_from_three_to_eight_vectors_a_thread():
    for hidden in (3072, 4096, 8192):
        assert check(FOUR, RmsProblem(hidden, "float32"), H200) == []
    # Validity does not depend on the affine flags: without weight or bias nothing loads early.
    bare = RmsProblem(4096, "float32", has_weight=False)
    assert check(FOUR, bare, H200) == []
    assert not derive_plan(FOUR, bare, H200).early_affine
    assert "wpre" not in render(FOUR, bare, H200).source


def test_the_search_asks_for_early_only_in_the_register_cache():
    params = {"threads": 256, "vec": 4, "rows_per_block": 1, "cache": "registers", "cluster": 1,
              "keep_x": False, "stats": "two_pass", "blocks_per_sm": 0, "max_regs": 0,
              "early": True}
    trial = FixedTrial(params)
    assert FAMILY.suggest(trial) == FOUR
    assert trial.params == params
    for other in ({"cache": "smem"}, {"blocks_per_sm": 2}, {"cluster": 2}):
        trial = FixedTrial({**params, **other})
        assert not FAMILY.suggest(trial).early
        assert "early" not in trial.params
