"""CPU tests of the defaults that replace one that spills (autonorm.fallback, dispatch).

The leaner picks are pure logic, checked here on the limits of the GPU kinds autonorm knows.
Dispatch's swap is checked with the compiler faked: each "compiled" kernel reports the local
memory the test gives its configuration, the attribute a real CuPy function reports. Whether
the picks stop spilling is measured by nvcc in ``tests/test_kinds_compile.py``.
"""

from __future__ import annotations

import dataclasses

import pytest

from autonorm import dispatch, fallback
from autonorm.errors import CompileError
from autonorm.export.arch import KNOWN
from autonorm.ops import registry
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.runtime import compiler
from autonorm.runtime.device import DeviceInfo

A100 = DeviceInfo("NVIDIA A100-SXM4-80GB", 80, 108, 41943040, 166912, 5120, 1593000)
BACKWARD = registry.get("layer_norm_backward")
FORWARD = registry.get("layer_norm")
# 16-bit LayerNorm backward of 4096 on an A100: its default holds the row in registers at 512
# threads and spills 32 bytes under nvcc 13.0 (sm_80).
SPILLING = BACKWARD.problem(hidden=4096, dtype="bfloat16")
ROWS = 16384


def test_the_leaner_picks_are_new_valid_and_distinct():
    limits = KNOWN[80]
    first = BACKWARD.default(SPILLING, limits, ROWS)
    picks = list(fallback.leaner_defaults(SPILLING, limits, ROWS, first))
    assert picks and first not in picks
    assert len(set(picks)) == len(picks)
    for config in picks:
        assert BACKWARD.check(config, SPILLING, limits) == []
    # The first is the rule's pick for three quarters of the register file.
    tighter = dataclasses.replace(limits, regs_per_sm=limits.regs_per_sm * 3 // 4)
    assert picks[0] == BACKWARD.default(SPILLING, tighter, ROWS)
    # It holds fewer elements a thread in registers: more threads, or one row in flight.
    assert (picks[0].threads * picks[0].blocks_per_sm, picks[0].prefetch) != (
        first.threads * first.blocks_per_sm, first.prefetch)


def test_the_forward_lifts_its_register_cap_first():
    problem = FORWARD.problem(hidden=1024, dtype="bfloat16")
    capped = KernelConfig(128, 8, 4, "smem", "two_pass", 1, 0, max_regs=64)
    assert FORWARD.check(capped, problem, KNOWN[100]) == []
    picks = list(fallback.leaner_defaults(problem, KNOWN[100], 65536, capped))
    assert picks[0] == dataclasses.replace(capped, max_regs=0)


def test_a_bulk_forward_takes_more_stages_first():
    problem = FORWARD.problem(hidden=16384, dtype="bfloat16")
    first = KernelConfig(256, 8, 1, "bulk", "two_pass", 1, 0, 3)
    assert FORWARD.check(first, problem, KNOWN[100]) == []
    picks = list(fallback.leaner_defaults(problem, KNOWN[100], 4096, first))
    assert [p.stages for p in picks[:2]] == [4, 6]
    assert all(dataclasses.replace(p, stages=3) == first for p in picks[:2])


def test_a_bulk_forward_then_splits_its_row_over_a_larger_cluster():
    # 512 threads: 128 registers a thread whatever the stages (the sm_100 default of 32768).
    problem = FORWARD.problem(hidden=32768, dtype="bfloat16")
    first = KernelConfig(512, 8, 1, "bulk", "two_pass", 1, 0, 2)
    assert FORWARD.check(first, problem, KNOWN[100]) == []
    picks = list(fallback.leaner_defaults(problem, KNOWN[100], 2048, first))
    clustered = [i for i, p in enumerate(picks) if p.cluster != first.cluster]
    assert clustered, picks
    # After every stage form, and first the cluster of 2 with the default's other fields.
    assert all(p.stages > first.stages for p in picks[:clustered[0]])
    assert picks[clustered[0]] == dataclasses.replace(first, cluster=2)


def test_nothing_is_offered_twice_or_invalid_on_every_kind():
    for cc, limits in KNOWN.items():
        for op in registry.known():
            family = registry.get(op)
            for hidden in (1024, 4096, 12288):
                problem = family.problem(hidden=hidden, dtype="bfloat16")
                first = family.default(problem, limits, ROWS)
                picks = list(fallback.leaner_defaults(problem, limits, ROWS, first))
                assert first not in picks and len(set(picks)) == len(picks), (cc, op, hidden)
                assert all(not family.check(p, problem, limits) for p in picks), (cc, op)


class FakeKernel:
    """What compile_kernel returns, as far as dispatch looks: the local memory it reports."""

    def __init__(self, rendered, local: int) -> None:
        self.rendered = rendered
        self.attributes = {"local_size_bytes": local}


@pytest.fixture
def a100(tmp_path, monkeypatch):
    """No databases, an A100, and a compiler whose kernels spill as ``spills`` says."""
    import autonorm.runtime.device

    monkeypatch.setenv("AUTONORM_DB", str(tmp_path / "user.db"))
    monkeypatch.setenv("AUTONORM_NO_SHIPPED_DB", "1")
    monkeypatch.setattr(autonorm.runtime.device, "query_device", lambda device_id=None: A100)
    spills: dict = {}
    compiled: list = []

    def compile_kernel(rendered, device_id=None, abi=None):
        compiled.append(rendered.config)
        local = spills.get(rendered.config, 0)
        if local is None:
            raise CompileError("rejected")
        return FakeKernel(rendered, local)

    monkeypatch.setattr(compiler, "compile_kernel", compile_kernel)
    dispatch.clear_cache()
    yield spills, compiled
    dispatch.clear_cache()


def test_dispatch_runs_the_first_leaner_default_that_does_not_spill(a100):
    spills, compiled = a100
    limits = A100.limits()
    first = BACKWARD.default(SPILLING, limits, ROWS)
    picks = list(fallback.leaner_defaults(SPILLING, limits, ROWS, first))
    spills[first] = 32
    spills[picks[0]] = None  # the first leaner pick does not compile: the next is tried
    kernel = dispatch.get_kernel(SPILLING, ROWS)
    assert kernel.rendered.config == picks[1]
    assert compiled == [first, picks[0], picks[1]]
    choice = dispatch.chosen(SPILLING, ROWS)
    assert (choice.config, choice.source) == (picks[1], "default")
    assert dispatch.get_kernel(SPILLING, ROWS) is kernel  # cached: nothing compiled again
    assert len(compiled) == 3


def test_dispatch_keeps_a_default_that_does_not_spill(a100):
    _, compiled = a100
    kernel = dispatch.get_kernel(SPILLING, ROWS)
    assert compiled == [BACKWARD.default(SPILLING, A100.limits(), ROWS)]
    assert kernel.attributes["local_size_bytes"] == 0


def test_dispatch_keeps_the_default_when_every_leaner_pick_spills(a100):
    spills, compiled = a100
    limits = A100.limits()
    first = BACKWARD.default(SPILLING, limits, ROWS)
    picks = list(fallback.leaner_defaults(SPILLING, limits, ROWS, first))
    spills.update({config: 16 for config in [first, *picks]})
    kernel = dispatch.get_kernel(SPILLING, ROWS)
    assert kernel.rendered.config == first
    assert compiled == [first, *picks]


def test_a_neighbours_winner_that_spills_gives_way_to_the_default(a100, tmp_path):
    from autonorm import lookup
    from autonorm.store.db import TuningDB, TuningKey

    spills, compiled = a100
    limits = A100.limits()
    tuned = FORWARD.problem(hidden=4096, dtype="bfloat16")
    problem = FORWARD.problem(hidden=5120, dtype="bfloat16")
    winner = KernelConfig(512, 8, 1, "registers", "two_pass", 1, 0)
    assert not FORWARD.check(winner, tuned, limits) and not FORWARD.check(winner, problem, limits)
    with TuningDB(tmp_path / "user.db") as db:
        db.record_device(A100)
        db.set_winner(TuningKey.for_problem(A100.fingerprint, tuned, 8192), winner.to_dict(),
                      {"median_us": 10.0}, lookup.kernel_of(winner, tuned, limits))
    assert dispatch.choose_config(problem, 8192).source == "user-neighbour"
    spills[winner] = 24
    default = FORWARD.default(problem, limits, 8192)
    assert default != winner
    kernel = dispatch.get_kernel(problem, 8192)
    assert compiled == [winner, default]
    assert kernel.rendered.config == default
    assert dispatch.chosen(problem, 8192) == lookup.Choice(default, "default")


def test_a_cluster_the_device_does_not_place_gives_way_to_the_portable_default(
    tmp_path, monkeypatch
):
    # LayerNorm fp32 65536's default splits its rows over 16 blocks on Hopper; where the
    # driver places no such cluster (compile_kernel refuses it), the default planned on the
    # portable 8 runs.
    import autonorm.runtime.device

    hopper = DeviceInfo("NVIDIA H200", 90, 132, 62914560, 232448, 6144, 3201000)
    monkeypatch.setenv("AUTONORM_DB", str(tmp_path / "user.db"))
    monkeypatch.setenv("AUTONORM_NO_SHIPPED_DB", "1")
    monkeypatch.setattr(autonorm.runtime.device, "query_device", lambda device_id=None: hopper)
    compiled: list = []

    def compile_kernel(rendered, device_id=None, abi=None):
        compiled.append(rendered.config)
        if rendered.launch.cluster > 8:
            raise CompileError(f"{rendered.config.label()}: no cluster of 16 blocks fits")
        return FakeKernel(rendered, 0)

    monkeypatch.setattr(compiler, "compile_kernel", compile_kernel)
    dispatch.clear_cache()
    problem = BACKWARD.problem(hidden=65536, dtype="float32")
    wide = BACKWARD.default(problem, hopper.limits(), 1024)
    portable = BACKWARD.default(problem, hopper.limits().portable(), 1024)
    assert (wide.cluster, portable.cluster) == (16, 8)
    try:
        kernel = dispatch.get_kernel(problem, 1024)
        assert kernel.rendered.config == portable
        assert compiled == [wide, portable]
        choice = dispatch.chosen(problem, 1024)
        assert (choice.config, choice.source) == (portable, "default")
        # A pick of the portable sizes that fails to compile is an error, as before.
        compiled.clear()
        monkeypatch.setattr(compiler, "compile_kernel", lambda *a, **k: (_ for _ in ()).throw(
            CompileError("rejected")))
        with pytest.raises(CompileError):
            dispatch.get_kernel(BACKWARD.problem(hidden=4096, dtype="float32"), 1024)
    finally:
        dispatch.clear_cache()
