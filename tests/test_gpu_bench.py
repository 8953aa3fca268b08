"""The finals' single-launch regime on a real GPU (bench.time_single_launches, docs/timing.md)."""

from __future__ import annotations

import pytest

from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.problem import Problem
from autonorm.runtime import timing as bench

pytestmark = pytest.mark.gpu

FAST = KernelConfig.from_label("t256v8r1-smem-two_pass-c1-p0-m64")
SLOW = KernelConfig.from_label("t64v1r1-smem-two_pass-c1-p0")


def test_single_launch_copy_agrees_with_the_back_to_back_copy() -> None:
    from autonorm.runtime.device import query_device

    flush = bench.FLUSH_L2_MULTIPLE * query_device(0).l2_bytes
    single = bench.single_copy_gbps(0, 1 << 28, flush)
    back_to_back = bench.copy_bandwidth_gbps(0)
    # 4,230-4,282 GB/s read-flushed from 256 MiB moved up (docs/timing.md); a single launch that
    # timed the host's enqueue, or a flush left in the window, would fall far below.
    assert 0.85 * back_to_back < single < 1.1 * back_to_back, (single, back_to_back)


def test_finals_time_long_problems_in_single_launches_and_rank_them() -> None:
    from autonorm.tune.evaluator import GpuEvaluator

    evaluator = GpuEvaluator(Problem(16384, "bfloat16"), rows=4096)
    assert evaluator.retimes_in_single_launches()  # 128 MiB moved: about 32 us at copy speed
    for config in (FAST, SLOW):
        assert evaluator.evaluate(config).ok
    fast, slow = evaluator.retime([FAST, SLOW], 3)
    assert fast.median_us < slow.median_us, (fast, slow)
    assert 0.5 < fast.share < 1.05, fast
    # The share is of a same-bytes copy timed the same way, not of the back-to-back copy.
    assert fast.copy_gbps == pytest.approx(
        bench.single_copy_gbps(0, evaluator.nbytes, bench.FLUSH_L2_MULTIPLE
                               * evaluator.info.l2_bytes), rel=1e-6)
    back_to_back = evaluator.time(FAST)
    assert 0.8 < back_to_back.median_us / fast.median_us < 1.25, (back_to_back, fast)


def test_finals_time_short_problems_back_to_back() -> None:
    from autonorm.tune.evaluator import GpuEvaluator

    evaluator = GpuEvaluator(Problem(16384, "bfloat16"), rows=8)
    assert not evaluator.retimes_in_single_launches()
    assert evaluator.evaluate(FAST).ok
    (timing,) = evaluator.retime([FAST], 2)
    assert timing.copy_gbps == pytest.approx(evaluator.copy_gbps, rel=1e-6)
