"""GPU: the timers leave work queued on the current stream alone.

CuPy hands a freed array's memory to the next allocation on the same stream while kernels
queued on that stream may still read it; the timers launch on a stream of their own. Without an
order between the two, a copy timed there wrote into float64 temporaries that a queued
reduction was still reading (timing.py, ``_after_current_stream``).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

# The copy's source and destination, 385 MiB each: the pool finds them among the freed 512 MiB
# temporaries. An odd MiB, so no other test's cached measurement answers for this size.
COPY_BYTES = (384 << 20) + (1 << 20)


def _queued_sums(cp, x):  # noqa: ANN001, ANN202
    """Eight sums of a temporary each, left queued; two 512 MiB temporaries freed per sum."""
    total = cp.zeros((), dtype=cp.float64)
    for _ in range(8):
        total += (x * x + x).sum()
    return total


def test_a_timed_copy_waits_for_the_work_queued_before_it() -> None:
    import cupy as cp

    from autonorm.runtime import timing

    x = cp.random.default_rng(0).standard_normal(1 << 26)  # float64, 512 MiB
    # Three rounds: from the second on, the pool holds the blocks the previous round freed,
    # which is where a copy overlapping the queued sums found its buffers. Each round copies
    # a size not measured before, so it is timed, not answered from the cache.
    for attempt in range(3):
        cp.cuda.Device().synchronize()
        total = _queued_sums(cp, x)
        timing.copy_bandwidth_gbps(0, COPY_BYTES + (attempt << 20))
        got = float(total)
        cp.cuda.Device().synchronize()
        want = float(_queued_sums(cp, x))
        assert got == want, (attempt, got, want)
