"""Launch the dispatched kernels of a few shapes (2^26 elements) once each, for ncu to profile.

The kernels are those `autonorm.layer_norm` would launch (`dispatch.get_kernel`, by row bucket).
Until session 5 this looked the DB up by dtype and hidden alone, which could pick the winner of a
latency bucket (rows 1-512) at 16384.

    ncu --kernel-name regex:autonorm_ln --section SpeedOfLight --section WarpStateStats \
        --section SchedulerStats --section Occupancy python benchmarks/lab/ncu_probe.py
"""

from __future__ import annotations

import cupy

from autonorm import dispatch
from autonorm.reference import from_float64
from autonorm.space import Problem

SHAPES = [("bfloat16", 1024), ("bfloat16", 4096), ("bfloat16", 16384), ("float32", 1024),
          ("float32", 16384)]


def main() -> None:
    import numpy as np

    for dtype, hidden in SHAPES:
        problem = Problem(hidden, dtype)
        rows = (1 << 26) // hidden
        kernel = dispatch.get_kernel(problem, rows)
        choice = dispatch.chosen(problem, rows)
        rng = np.random.default_rng(0)
        x = cupy.asarray(from_float64(rng.standard_normal((rows, hidden)), dtype))
        w = cupy.asarray(from_float64(1 + 0.1 * rng.standard_normal(hidden), dtype))
        b = cupy.asarray(from_float64(0.1 * rng.standard_normal(hidden), dtype))
        y = cupy.empty_like(x)
        print(dtype, hidden, choice.source, choice.config.label(), flush=True)
        for _ in range(2):
            kernel.launch_arrays(x, w, b, y, rows, 1e-5)
        cupy.cuda.runtime.deviceSynchronize()


if __name__ == "__main__":
    main()
