"""Launch autonorm's dispatched kernel and torch.compile's LayerNorm at a few shapes, for ncu.

The kernel is the one `autonorm.layer_norm` would launch (`dispatch.get_kernel`: the user DB,
then the shipped DB, by row bucket).

Only the launches between cudaProfilerStart/Stop are profiled (torch.compile's own warm-up and
autotuning stay outside):

    ncu --profile-from-start off --clock-control none --section SpeedOfLight \
        --section LaunchStats --section Occupancy --section WarpStateStats \
        --section SchedulerStats --section ComputeWorkloadAnalysis \
        python benchmarks/lab/ncu_peers.py bfloat16:1024 bfloat16:16384
"""

from __future__ import annotations

import sys

import cupy
import torch
import torch.nn.functional as F

from autonorm import dispatch
from autonorm.space import Problem


def main() -> None:
    for spec in sys.argv[1:]:
        dtype, hidden = spec.split(":")[0], int(spec.split(":")[1])
        rows = (1 << 26) // hidden
        problem = Problem(hidden, dtype)
        kernel = dispatch.get_kernel(problem, rows)
        choice = dispatch.chosen(problem, rows)
        tdt = getattr(torch, dtype)
        x = torch.randn(rows, hidden, device="cuda", dtype=tdt)
        w = 1 + 0.1 * torch.randn(hidden, device="cuda", dtype=tdt)
        b = 0.1 * torch.randn(hidden, device="cuda", dtype=tdt)
        y = torch.empty_like(x)
        compiled = torch.compile(lambda t: F.layer_norm(t, (hidden,), w, b, 1e-5))
        for _ in range(3):
            compiled(x)
            kernel.launch_arrays(cupy.asarray(x), cupy.asarray(w), cupy.asarray(b),
                                 cupy.asarray(y), rows, 1e-5)
        torch.cuda.synchronize()
        print(dtype, hidden, "autonorm", choice.source, choice.config.label(), flush=True)
        torch.cuda.profiler.start()
        kernel.launch_arrays(cupy.asarray(x), cupy.asarray(w), cupy.asarray(b), cupy.asarray(y),
                             rows, 1e-5)
        compiled(x)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
