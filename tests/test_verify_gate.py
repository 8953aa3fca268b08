"""CPU: the verification gate rejects broken kernels, and its cases can see what they must.

verify() runs here through its array-module seam (``xp=numpy``) on kernels written in NumPy
(autonorm.ops.layer_norm.emulation): the fp32 arithmetic of the CUDA kernels, correct, and with
one fault each. The errors pinned below were measured with that emulation (and, where named, on
an H200); a tolerance loose enough to pass any of them would let a broken kernel win.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np
import pytest

from autonorm.dtypes import DTYPES
from autonorm.numerics import TOLERANCES, from_float64, to_float64
from autonorm.ops.layer_norm.cases import (
    HOT_SPREAD,
    OUTLIER_CASE,
    ROW_CASES,
    VERIFY_ROWS,
    Case,
    cluster_splits,
    make_cases,
)
from autonorm.ops.layer_norm.config import CLUSTERS
from autonorm.ops.layer_norm.emulation import FAULTS, MERGE_FAULTS, EmulatedKernel
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.verify import verify
from autonorm.results import Timing
from autonorm.runtime.abi import KernelABI

_OFFSET = {"float32": (1000.0, 0.1), "float16": (300.0, 1.0), "bfloat16": (64.0, 4.0)}


@functools.cache
def cases_of(problem: Problem) -> tuple[Case, ...]:
    return tuple(make_cases(problem))


def run(problem: Problem, fault: str = "none", cluster: int = 1, row_cases_only: bool = False):
    """verify() an emulated kernel on the CPU (on the row cases alone if asked)."""
    kernel = EmulatedKernel(problem, fault, cluster=cluster, vec=16 // problem.itemsize)
    cases = [c for c in cases_of(problem) if c.name in ROW_CASES or not row_cases_only]
    return verify(kernel, problem, xp=np, cases=cases)


def failed(result) -> set[str]:  # noqa: ANN001
    """The names of the cases that failed."""
    return {f.split(":")[0] for f in result.failures}


def merge_case_names(hidden: int) -> list[str]:
    names = [f"{kind}-c{c}" for c in cluster_splits(hidden) for kind in ("step", "hot")]
    return names + (["ramp"] if hidden > 1 else [])


# --------------------------------------------------------------------------- the cases


@pytest.mark.parametrize("hidden", [1, 7, 768, 1000, 4096])
def test_the_row_cases_come_first_then_a_merge_case_for_every_split(hidden):
    cases = make_cases(Problem(hidden, "float32"))
    assert [c.name for c in cases] == [*ROW_CASES, *merge_case_names(hidden)]
    assert cluster_splits(hidden) == [c for c in CLUSTERS if c > 1 and hidden % c == 0]
    for case in cases:
        assert case.x.shape == (VERIFY_ROWS, hidden) and np.isfinite(case.x).all()
    merge = [c for c in cases if c.name not in ROW_CASES]
    assert not any(c.small_grid or c.expect_bias for c in merge)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [1000, 4096])
def test_the_outlier_sits_where_the_shift_is_taken(dtype, hidden):
    cases = make_cases(Problem(hidden, dtype))
    assert cases[ROW_CASES.index(OUTLIER_CASE)].name == OUTLIER_CASE
    x = cases[ROW_CASES.index(OUTLIER_CASE)].x
    offset = cases[ROW_CASES.index("offset")].x
    mean, spread = _OFFSET[dtype]
    # The row's first element (every kernel's shift) and the second half's first (the shift of
    # a cluster of two's second block), 3000 spreads above the mean; the rest as the offset case.
    outliers = np.argwhere(np.abs(x - mean) > 100 * spread)
    assert {tuple(p) for p in outliers} == {
        (row, col) for row in range(VERIFY_ROWS) for col in (0, hidden // 2)
    }
    assert (x[:, [0, hidden // 2]] == mean + 3000 * spread).all()
    others = np.ones(hidden, bool)
    others[[0, hidden // 2]] = False
    np.testing.assert_array_equal(x[:, others], offset[:, others])


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_segments_of_a_merge_case_differ_after_rounding(dtype):
    hidden = 4096
    cases = {c.name: c for c in make_cases(Problem(hidden, dtype))}
    for c in cluster_splits(hidden):
        seg = hidden // c
        step = to_float64(from_float64(cases[f"step-c{c}"].x, dtype), dtype)
        means = step.reshape(VERIFY_ROWS, c, seg).mean(axis=2)
        # Neighbouring segments 2 to 4 spreads apart, each row its own step.
        gaps = np.abs(np.diff(means, axis=1))
        assert gaps.min() > 1.5 and gaps.max() < 4.5, (c, gaps.min(), gaps.max())
        assert len(np.unique(np.round(means[:, 0], 6))) == VERIFY_ROWS
        hot = to_float64(from_float64(cases[f"hot-c{c}"].x, dtype), dtype)
        spreads = hot.reshape(VERIFY_ROWS, c, seg).std(axis=2)
        hottest = spreads.argmax(axis=1)
        np.testing.assert_array_equal(hottest, np.arange(VERIFY_ROWS) % c)
        rest = np.sort(spreads, axis=1)[:, :-1]
        assert (spreads.max(axis=1) > 0.8 * HOT_SPREAD).all() and (rest < 1.2).all()
    ramp = to_float64(from_float64(cases["ramp"].x, dtype), dtype)
    for c in cluster_splits(hidden):
        means = ramp.reshape(VERIFY_ROWS, c, hidden // c).mean(axis=2)
        steps = np.diff(means, axis=1)
        assert ((steps > 0).all(axis=1) | (steps < 0).all(axis=1)).all(), c


def test_merge_cases_are_deterministic_and_follow_the_seed():
    problem = Problem(1024, "bfloat16")
    a, b, other = make_cases(problem), make_cases(problem), make_cases(problem, seed=1)
    for ca, cb, co in zip(a, b, other, strict=True):
        np.testing.assert_array_equal(ca.x, cb.x)
        assert not np.array_equal(ca.x, co.x) or ca.name == "constant"


# --------------------------------------------------------------------------- correct kernels


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cluster", [1, 2, 4, 8])
def test_a_correct_kernel_passes_every_case_well_inside_the_tolerance(dtype, cluster):
    result = run(Problem(4096, dtype), "none", cluster)
    assert result.ok, result.summary()
    assert set(result.errors) == {c.name for c in cases_of(Problem(4096, dtype))}
    # Room under the tolerance: a correct kernel must never be a coin toss.
    assert result.max_rel_err < 0.3 * TOLERANCES[dtype]["rel_l2"], result.max_rel_err
    assert max(e.scaled_max for e in result.errors.values()) < 0.5 * TOLERANCES[dtype][
        "scaled_max"]


@pytest.mark.parametrize("affine", [(False, False), (True, False), (False, True)])
def test_a_correct_kernel_passes_without_weight_or_bias(affine):
    assert run(Problem(1000, "float16", *affine)).ok


# --------------------------------------------------------------------------- broken kernels


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cluster", [2, 4, 8])
@pytest.mark.parametrize("fault", MERGE_FAULTS)
def test_each_broken_merge_is_rejected_by_the_merge_cases(fault, cluster, dtype):
    result = run(Problem(16384, dtype), fault, cluster)
    assert not result.ok
    assert {f"step-c{cluster}", "ramp"} <= failed(result), result.failures
    worst = max(e.rel_l2 for name, e in result.errors.items() if name not in ROW_CASES)
    assert worst > 50 * TOLERANCES[dtype]["rel_l2"], worst


# The blind spot the merge cases close: on the row cases alone these broken merges passed in
# 16-bit (random rows give every segment nearly the same mean and spread).
ROW_CASES_MISSED = [
    (dtype, 16384, "no-between", cluster)
    for dtype in ("float16", "bfloat16") for cluster in (2, 4, 8)
] + [("bfloat16", 32768, fault, 2) for fault in ("mean-merge", "own-mean")]


@pytest.mark.parametrize(("dtype", "hidden", "fault", "cluster"), ROW_CASES_MISSED)
def test_the_merge_cases_catch_what_the_row_cases_missed(dtype, hidden, fault, cluster):
    problem = Problem(hidden, dtype)
    assert run(problem, fault, cluster, row_cases_only=True).ok
    result = run(problem, fault, cluster)
    assert not result.ok and failed(result) <= set(merge_case_names(hidden)), result.failures


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("cluster", [1, 4])
def test_the_unshifted_one_pass_variance_fails_the_offset_rows(dtype, cluster):
    # bf16's offset rows (mean 64, spread 4) cancel 8 bits: fp32 keeps the variance there.
    result = run(Problem(4096, dtype), "naive", cluster)
    assert "offset" in failed(result), result.failures


@pytest.mark.parametrize("hidden", [4096, 16384])
@pytest.mark.parametrize("cluster", [1, 4])
def test_the_uncorrected_fp32_two_pass_fails_the_outlier_case_and_only_it(hidden, cluster):
    # 16-bit kernels use this two-pass: their outputs cannot show the bits it loses.
    result = run(Problem(hidden, "float32"), "uncorrected", cluster)
    assert failed(result) == {OUTLIER_CASE}, result.failures


@pytest.mark.parametrize("hidden", [1, 7, 490, 1000, 4096, 65536])
def test_fused_fp32_statistics_pass_as_well_as_the_two_pass(hidden):
    # The few-row kernels' fp32 fused sums about the mean of the row's first 8 elements, the
    # corrected two-pass past 2 bits (plan.fuses_passes): within 1.5e-7 on the offset rows and
    # as close as the two-pass on the outlier rows, whose shift takes the second pass.
    problem = Problem(hidden, "float32")
    fused = verify(EmulatedKernel(problem, fused=True), problem, xp=np, cases=cases_of(problem))
    two_pass = run(problem)
    assert fused.ok, fused.summary()
    assert fused.errors["offset"].rel_l2 <= 1.5e-7
    assert fused.errors[OUTLIER_CASE].rel_l2 <= 1.1 * two_pass.errors[OUTLIER_CASE].rel_l2 + 1e-8


@pytest.mark.parametrize("hidden", [4096, 16384, 65536])
def test_fused_fp32_statistics_without_their_guard_fail_the_outlier_case(hidden):
    # Without the second pass the outlier rows (the first element 3000 spreads out, which pulls
    # the shift 375 spreads out) cancel bits the fp32 tolerance cannot spare from 4,096 elements
    # on; at 490-1,072 they stay within it (3-6e-7): the outliers weigh more in the row's spread.
    problem = Problem(hidden, "float32")
    result = verify(EmulatedKernel(problem, "unguarded"), problem, xp=np, cases=cases_of(problem))
    assert failed(result) == {OUTLIER_CASE}, result.failures


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_constant_rows_must_give_the_bias_bit_for_bit(dtype):
    # Summing x rather than x - shift gives a constant row of 1000 elements an inexact mean:
    # an error under the tolerances, caught by the exact-bias check alone.
    result = run(Problem(1000, dtype), "unshifted")
    assert result.failures == ["constant: constant rows must give exactly the bias"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_unwritten_rows_and_writes_past_the_end_fail_every_case(dtype):
    problem = Problem(768, dtype)
    names = [c.name for c in cases_of(problem)]
    unwritten = run(problem, "unwritten")
    assert [f for f in unwritten.failures if "unwritten" in f] == [
        f"{n}: 768 elements unwritten or NaN" for n in names]
    past = run(problem, "past-end")
    assert [f for f in past.failures if "past the last row" in f] == [
        f"{n}: wrote past the last row" for n in names]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cluster", [1, 4])
def test_a_kernel_without_the_grid_stride_loop_fails_the_one_cluster_grid(dtype, cluster):
    result = run(Problem(1024, dtype), "no-grid-stride", cluster)
    assert failed(result) == {"normal-one-cluster-grid"}, result.failures
    assert "unwritten" in result.failures[0]


def test_the_largest_element_error_counts_where_the_l2_error_hides_it():
    # One element a row without weight and bias: under bf16's rel_l2 tolerance on the normal
    # rows, far over its scaled_max.
    result = run(Problem(4096, "bfloat16"), "tail")
    normal = result.errors["normal"]
    assert normal.rel_l2 < TOLERANCES["bfloat16"]["rel_l2"]
    assert normal.scaled_max > 5 * TOLERANCES["bfloat16"]["scaled_max"]
    assert "normal" in failed(result)


def test_every_fault_is_tested_and_the_emulation_refuses_nonsense():
    assert set(FAULTS) == {
        "none", "naive", "uncorrected", "unshifted", *MERGE_FAULTS, "tail", "unwritten",
        "past-end", "no-grid-stride", "unguarded",
    }
    with pytest.raises(ValueError, match="unknown fault"):
        EmulatedKernel(Problem(64, "float32"), "slow")
    with pytest.raises(ValueError, match="cluster"):
        EmulatedKernel(Problem(64, "float32"), "no-between", cluster=1)
    with pytest.raises(ValueError, match="fused fp32 statistics"):
        EmulatedKernel(Problem(64, "bfloat16"), fused=True)
    with pytest.raises(ValueError, match="fused fp32 statistics"):
        EmulatedKernel(Problem(64, "float32"), "unguarded", cluster=2)


# --------------------------------------------------------------------------- tolerances

# The smallest error of a known-broken kernel, per dtype: the tolerance must stay below it.
# (kernel, case, hidden, cluster, rel_l2 measured by the emulation, rel_l2 measured on the H200)
KNOWN_FAILURES = {
    "float32": ("uncorrected", OUTLIER_CASE, 4096, 4, 2.31e-6, 2.1e-6),
    "float16": ("naive", "offset", 4096, 4, 2.16e-3, None),
    "bfloat16": ("mean-merge", "normal", 16384, 2, 9.32e-3, None),
}


@pytest.mark.parametrize("dtype", DTYPES)
def test_each_tolerance_rejects_the_smallest_known_failure(dtype):
    fault, case, hidden, cluster, emulated, measured = KNOWN_FAILURES[dtype]
    error = run(Problem(hidden, dtype), fault, cluster).errors[case]
    assert error.rel_l2 == pytest.approx(emulated, rel=0.02)
    assert not error.within(dtype)
    assert TOLERANCES[dtype]["rel_l2"] < min(emulated, measured or emulated)


# --------------------------------------------------------------------------- the evaluator's gate


@dataclass(frozen=True)
class GateProblem(Problem):
    """A LayerNorm problem served by the emulating family below."""

    op: ClassVar[str] = "emulated_layer_norm"


@dataclass(frozen=True)
class Emulation:
    """A candidate of the emulating family: which fault its kernel has."""

    fault: str
    cluster: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {"fault": self.fault, "cluster": self.cluster}

    def label(self) -> str:
        return f"{self.fault}-c{self.cluster}"


class CompiledEmulation(EmulatedKernel):
    attributes: ClassVar[dict[str, int]] = {}  # no local memory: nothing spills


class SpillingEmulation(EmulatedKernel):
    attributes: ClassVar[dict[str, int]] = {"local_size_bytes": 48}  # spills, as ptxas reports


class EmulatedWorkload:
    """LayerNorm's verification on the CPU; launches only record which kernel was timed."""

    nbytes = 1 << 20
    n_sets = 2

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        self.timed: list[str] = []

    def launch(self, kernel: EmulatedKernel, index: int, stream_ptr: int) -> None:
        self.timed.append(kernel.label())

    def verify(self, kernel: EmulatedKernel):  # noqa: ANN201
        return verify(kernel, self.problem, xp=np)


class EmulatingFamily:
    op = "emulated_layer_norm"

    def render(self, config: Emulation, problem: Problem, device: Any) -> Any:
        return SimpleNamespace(config=config, problem=problem)

    def kernel_abi(self, kernel: Any) -> KernelABI:
        return KernelABI("QQQQif", rows_index=4, workspace=True)

    def workload(self, problem: Problem, rows: int, *, device_id: int, seed: int) -> Any:
        return EmulatedWorkload(problem)


def test_the_evaluator_times_only_kernels_that_verify(monkeypatch):
    from autonorm.ops import registry
    from autonorm.runtime import compiler, device, timing
    from autonorm.runtime.limits import H200
    from autonorm.tune.evaluator import GpuEvaluator

    monkeypatch.setattr(device, "query_device", lambda device_id=None: device.DeviceInfo(
        H200.name, H200.cc, H200.sm_count, H200.l2_bytes, H200.max_smem_optin, 6144, 3201000))
    monkeypatch.setattr(timing, "copy_bandwidth_gbps", lambda device_id=0: 4000.0)

    def compile_kernel(rendered: Any, device_id: int, abi: KernelABI) -> EmulatedKernel:
        config = rendered.config
        kind = SpillingEmulation if config.cluster == 2 else CompiledEmulation
        return kind(rendered.problem, config.fault, cluster=config.cluster, vec=8)

    def time_launches(launch: Any, nbytes: int, n_sets: int, **kw: Any) -> Timing:
        launch(0, 0)
        return Timing(median_us=10.0, p20_us=9.9, p80_us=10.1, cv=0.01, gbps=100.0, share=0.5)

    monkeypatch.setattr(compiler, "compile_kernel", compile_kernel)
    monkeypatch.setattr(timing, "time_launches", time_launches)
    registry.register(EmulatingFamily())
    try:
        evaluator = GpuEvaluator(GateProblem(16384, "bfloat16"), 1024)
        good = evaluator.evaluate(Emulation("none", 4))
        assert good.ok and good.timing.median_us == 10.0, good
        assert good.max_rel_err < 0.3 * TOLERANCES["bfloat16"]["rel_l2"]
        for fault in MERGE_FAULTS:
            bad = evaluator.evaluate(Emulation(fault, 4))
            assert bad.status == "verification" and bad.timing is None, bad
            assert "step-c4:" in bad.error and bad.max_rel_err > 0.1, bad
        unwritten = evaluator.evaluate(Emulation("unwritten", 1))
        assert unwritten.status == "verification" and "unwritten" in unwritten.error
        # A kernel with local memory is verified and timed like any other: the timing, not
        # the spill, decides (a spilling default can beat every spill-free kernel).
        spilling = evaluator.evaluate(Emulation("none", 2))
        assert compiler.local_bytes(evaluator._compile(Emulation("none", 2))) == 48
        assert spilling.ok and spilling.timing.median_us == 10.0, spilling
        broken = evaluator.evaluate(Emulation(MERGE_FAULTS[0], 2))
        assert broken.status == "verification" and broken.timing is None, broken
        # The broken ones never reached the timer.
        assert evaluator.workload.timed == ["none-c4", "none-c2"]
    finally:
        registry.unregister("emulated_layer_norm")
