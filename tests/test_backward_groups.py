"""Groups of blocks that take rows side by side in one cluster, without a GPU.

A backward kernel with ``groups`` launches one cluster of ``cluster * groups`` blocks whatever
the rows: each group of ``cluster`` blocks takes every ``groups``-th row, and the groups'
column sums meet in distributed shared memory instead of at a grid barrier. These tests check
its rules, plan, launch, names and the search's questions; ``tests/test_gpu_backward.py``
verifies such kernels on the GPU and rejects one that leaves a group's sums out.
"""

from __future__ import annotations

import dataclasses

import pytest

from autonorm.ops import registry
from autonorm.ops.norm_backward.codegen import kernel_name
from autonorm.ops.norm_backward.config import GROUPS, BackwardConfig
from autonorm.ops.norm_backward.plan import check, derive_plan
from autonorm.ops.norm_backward.problem import LayerNormBackward, RMSNormBackward
from autonorm.runtime.limits import H200

GROUPED = BackwardConfig(128, 8, "bulk", "registers", 1, stages=2, cluster=2, groups=4)


def test_groups_label_round_trips() -> None:
    assert GROUPED.label() == "t128v8-bulk-accregisters-p1-s2-c2-g4"
    assert BackwardConfig.from_label(GROUPED.label()) == GROUPED
    held = dataclasses.replace(GROUPED, hold=True, cluster=1, groups=8)
    assert held.label() == "t128v8-bulk-accregisters-p1-s2-g8-h"
    assert BackwardConfig.from_label(held.label()) == held


def test_groups_rules_name_the_problem() -> None:
    problem = LayerNormBackward(4096, "bfloat16")
    assert check(GROUPED, problem, H200) == []

    def reasons(**fields: object) -> str:
        return "; ".join(check(dataclasses.replace(GROUPED, **fields), problem, H200))

    assert "exceeds 8 blocks" in reasons(cluster=4, groups=4)
    assert "blocks_per_sm must be 1" in reasons(blocks_per_sm=2)
    assert "acc='global'" in reasons(acc="global")
    assert "cache='bulk'" in reasons(cache="registers", stages=0, cluster=1)
    assert "groups must be one of" in reasons(groups=3)
    no_sums = LayerNormBackward(4096, "bfloat16", has_weight=False, has_bias=False)
    assert any("none to meet" in r for r in check(
        dataclasses.replace(GROUPED, acc="registers"), no_sums, H200))


@pytest.mark.parametrize(("dtype", "acc"), [("bfloat16", "registers"), ("float32", "registers"),
                                            ("bfloat16", "smem")])
def test_groups_meet_where_the_stages_were(dtype: str, acc: str) -> None:
    # Sums held in registers meet in shared memory where the stages were, which must hold them
    # (two fp32 sums of the block's share); the mbarriers follow.
    problem = LayerNormBackward(4096, dtype)
    vec = 16 // problem.itemsize
    config = dataclasses.replace(GROUPED, vec=vec, acc=acc, stages=1)
    plan = derive_plan(config, problem)
    seg = 4096 // 2
    staged = 2 * 1 * seg * problem.itemsize
    sums = 2 * seg * 4
    if acc == "registers":
        assert plan.stage_offset == 0
        assert plan.bars_offset == max(staged, sums)
    else:
        assert plan.stage_offset == sums
        assert plan.bars_offset == sums + staged
    assert plan.smem_bytes == plan.bars_offset + 8
    # Without groups the mbarriers follow the stages, as before.
    plain = derive_plan(dataclasses.replace(config, groups=1), problem)
    assert plain.bars_offset == plain.stage_offset + staged


def test_groups_launch_one_cluster() -> None:
    problem = LayerNormBackward(4096, "bfloat16")
    kernel = registry.get("layer_norm_backward").render(GROUPED, problem, H200)
    launch = kernel.launch
    assert launch.cluster == 8 and launch.single
    assert "__cluster_dims__(8, 1, 1)" in kernel.source
    assert "constexpr int R = 4;" in kernel.source
    for rows in (1, 3, 64, 10**6):
        assert launch.grid(rows, 132, resident_clusters=16) == 8
        assert not launch.uses_counter(rows, 8)
    # The verifier's grid of three clusters meets at the barrier, each cluster's groups first.
    assert launch.uses_counter(37, 24)
    assert "cluster.map_shared_rank(fin, r * C + crank)" in kernel.source


def test_groups_keep_the_names_of_kernels_without_them() -> None:
    problem = LayerNormBackward(4096, "bfloat16")
    plain = BackwardConfig(256, 8, "bulk", "registers", 2, stages=2)
    # The name this kernel had before groups existed: stored winners keep their digests.
    assert kernel_name(plain, problem) == "autonorm_ln_bwd_cef12b0928456aa7"
    assert kernel_name(GROUPED, problem) != kernel_name(
        dataclasses.replace(GROUPED, groups=1), problem)


@pytest.mark.parametrize("problem", [LayerNormBackward(4096, "bfloat16"),
                                     RMSNormBackward(1024, "float32")])
def test_space_holds_groups_of_bulk_kernels_only(problem) -> None:  # noqa: ANN001
    family = registry.get(f"{problem.forward_op}_backward")
    space = family.space(problem, H200)
    grouped = [c for c in space if c.groups > 1]
    assert {c.groups for c in grouped} == set(GROUPS) - {1}
    assert all(c.cache == "bulk" and c.blocks_per_sm == 1 and c.cluster * c.groups <= 8
               for c in grouped)
    assert all(check(c, problem, H200) == [] for c in grouped)


class _Trial:
    """Answers every question with the last choice, and records the questions."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def suggest_categorical(self, name: str, choices):  # noqa: ANN001, ANN201
        self.asked.append(name)
        return "bulk" if name == "cache" else choices[-1]


def test_search_asks_hold_and_groups_of_bulk_kernels() -> None:
    trial = _Trial()
    config = registry.get("layer_norm_backward").suggest(trial)
    assert config.cache == "bulk"
    assert {"hold", "groups", "cluster", "stages"} <= set(trial.asked)
    assert config.hold and config.groups == GROUPS[-1]


@pytest.mark.parametrize(("op", "dtype", "hidden", "rows", "label"), [
    # CUDA-graph replay, against the few-row form (t128v8-...-c4, or the default where there is
    # none) in the same run (H200, docs/backward.md): bf16 LayerNorm 4096 3.4 us against 5.8 at
    # 2 rows, 4.9 against 6.0 at 8; RMSNorm 4096 2.9 against 4.5 at 2 rows; 8192 at 2 rows 3.9
    # against 7.2 (LayerNorm) and 3.1 against 5.5 (RMSNorm), at 8 rows RMSNorm 4.5 against 5.8.
    ("layer_norm_backward", "bfloat16", 4096, 2, "t128v8-bulk-accregisters-p1-s2-c4-g2"),
    ("layer_norm_backward", "bfloat16", 4096, 8, "t128v8-bulk-accregisters-p1-s2-c2-g4"),
    ("rms_norm_backward", "bfloat16", 4096, 2, "t128v8-bulk-accregisters-p1-s2-c4-g2"),
    ("layer_norm_backward", "bfloat16", 8192, 2, "t128v8-bulk-accregisters-p1-s2-c4-g2"),
    ("rms_norm_backward", "bfloat16", 8192, 2, "t128v8-bulk-accregisters-p1-s2-c4-g2"),
    ("rms_norm_backward", "bfloat16", 8192, 8, "t128v8-bulk-accregisters-p1-s2-c2-g4"),
    # A block a row where the sums fit: RMSNorm bf16 4096 at 8 rows 3.3 us against 3.8 for
    # two clusters of two; bf16 1024 (one block a row already) 3.0 against 5.1, and 768 (no
    # few-row form) 3.2 against 4.1 (LayerNorm); fp32 1024 3.0 against 4.8 and RMSNorm fp32
    # 4096 3.5 against 4.4.
    ("rms_norm_backward", "bfloat16", 4096, 8, "t128v8-bulk-accregisters-p1-s2-g8"),
    ("layer_norm_backward", "bfloat16", 1024, 8, "t128v8-bulk-accregisters-p1-s2-g8"),
    ("layer_norm_backward", "bfloat16", 768, 8, "t64v8-bulk-accregisters-p1-s2-g8"),
    ("layer_norm_backward", "float32", 1024, 8, "t128v4-bulk-accregisters-p1-s2-g8"),
    ("rms_norm_backward", "float32", 4096, 8, "t128v4-bulk-accregisters-p1-s2-g8"),
    # fp32 4096 at 2 and 4 rows: 3.3 and 3.8 us against 4.9 and 5.1 (LayerNorm).
    ("layer_norm_backward", "float32", 4096, 2, "t128v4-bulk-accregisters-p1-s2-c4-g2"),
    ("layer_norm_backward", "float32", 4096, 4, "t128v4-bulk-accregisters-p1-s2-c2-g4"),
    # Four rows a block lost (LayerNorm bf16 8192 at 8 rows: groups of two clusters of four
    # would take four rows a block; two of two do not fit their sums in registers): there the
    # bulk kernel summing from the rows ran 5.5 us against the few-row form's 7.8. Two rows of
    # 16 KB lost too (RMSNorm fp32 8192 at 8 rows, 5.6 us against 4.7), and rows of 32 KB keep
    # the few-row form.
    ("layer_norm_backward", "bfloat16", 8192, 8, "t512v8-bulk-accreread-p1-s2-h-l"),
    ("rms_norm_backward", "float32", 8192, 8, "t128v4-bulk-accregisters-p1-s2-c4"),
])
def test_few_rows_take_one_cluster_of_groups(op: str, dtype: str, hidden: int, rows: int,
                                             label: str) -> None:
    family = registry.get(op)
    problem = family.problem(hidden=hidden, dtype=dtype)
    assert family.default(problem, H200, rows).label() == label


@pytest.mark.parametrize("op", ["layer_norm_backward", "rms_norm_backward"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("hidden", [1, 7, 768, 1000, 1024, 2048, 4096, 4099, 8192, 12288])
def test_groups_default_follows_its_rule(op: str, dtype: str, hidden: int) -> None:
    from autonorm.ops.base import rows_bucket
    from autonorm.ops.norm_backward.few_rows import (
        GROUP_BLOCK_BYTES,
        GROUP_ROWS,
        GROUP_ROWS_PER_BLOCK,
        _few_rows_form,
        _group_base,
        _groups_form,
    )

    family = registry.get(op)
    problem = family.problem(hidden=hidden, dtype=dtype)
    few = _few_rows_form(problem, H200)
    base = _group_base(problem, H200, few)
    for rows in (1, 2, 3, 4, 5, 7, 8, 9, 16):
        config = _groups_form(problem, H200, rows, few)
        # A rows bucket has one form: dispatch caches its kernel by bucket.
        assert config == _groups_form(problem, H200, rows_bucket(rows), few)
        if config is None:
            continue
        # The default takes it.
        assert family.default(problem, H200, rows) == config
        bucket = rows_bucket(rows)
        assert 2 <= bucket <= GROUP_ROWS
        assert config.groups > 1 and check(config, problem, H200) == []
        assert config.cluster <= base.cluster
        per_block = -(-bucket // config.groups)
        assert per_block <= GROUP_ROWS_PER_BLOCK
        assert per_block * hidden // config.cluster * problem.itemsize <= GROUP_BLOCK_BYTES
        assert dataclasses.replace(config, cluster=base.cluster, groups=1, acc=base.acc) == base
    if base is None:
        assert all(_groups_form(problem, H200, r, few) is None for r in (2, 4, 8))
    # The base is the few-row form where there is one, else its form for rows too short for it.
    assert base == few or (few is None and base.threads * base.vec <= hidden)
