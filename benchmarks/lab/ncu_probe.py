"""Launch a few shipped-winner configurations once each, for ncu to profile.

    ncu --kernel-name regex:autonorm_ln --section SpeedOfLight --section WarpStateStats \
        --section SchedulerStats --section Occupancy python benchmarks/lab/ncu_probe.py
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import cupy

from autonorm import codegen, compiler
from autonorm.reference import from_float64
from autonorm.space import H200, KernelConfig, Problem

SHAPES = [("bfloat16", 1024), ("bfloat16", 4096), ("bfloat16", 16384), ("float32", 1024),
          ("float32", 16384)]


def main() -> None:
    import numpy as np

    db = sqlite3.connect(Path(__file__).parents[2] / "tuning_db" / "autonorm.db")
    for dtype, hidden in SHAPES:
        (cfg,) = db.execute("select config from winners where dtype=? and hidden=? limit 1",
                            (dtype, hidden)).fetchone()
        config = KernelConfig.from_dict(json.loads(cfg))
        problem = Problem(hidden, dtype)
        kernel = compiler.compile_kernel(codegen.render(config, problem, H200))
        rows = (1 << 26) // hidden
        rng = np.random.default_rng(0)
        x = cupy.asarray(from_float64(rng.standard_normal((rows, hidden)), dtype))
        w = cupy.asarray(from_float64(1 + 0.1 * rng.standard_normal(hidden), dtype))
        b = cupy.asarray(from_float64(0.1 * rng.standard_normal(hidden), dtype))
        y = cupy.empty_like(x)
        print(dtype, hidden, config.label(), flush=True)
        for _ in range(2):
            kernel.launch_arrays(x, w, b, y, rows, 1e-5)
        cupy.cuda.runtime.deviceSynchronize()


if __name__ == "__main__":
    main()
