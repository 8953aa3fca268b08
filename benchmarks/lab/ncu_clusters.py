"""Why the fwd kernel's clusters are slow (lab only; session 10, call F): ncu beside c1.

NOTES.md 51-52: at bf16 16384 the fwd kernel's t256v8r1-smem-m64 runs 92% of copy with c1 and
52-62% with c2, at the same registers, persistent or not, with cluster barriers or st.async
pushes. This launches, between cudaProfilerStart/Stop, c1 and c2 (and c2 at 32768, and the bulk
c2 kernel for contrast) once each, and prints the grid, the occupancy the driver reports for
blocks and clusters, and one event-timed launch of each. Run under ncu (call_s10f.sh).
"""

from __future__ import annotations

import cupy
from cluster_cap_lab import lift_cluster_cap_rule

from autonorm import codegen, compiler
from autonorm.reference import from_float64
from autonorm.space import H200, KernelConfig, Problem

CASES = [
    (16384, "t256v8r1-smem-two_pass-c1-p0-m64"),
    (16384, "t256v8r1-smem-two_pass-c2-p0-m64"),
    (16384, "t128v8r1-smem-two_pass-c2-p0-m64"),
    (32768, "t256v8r1-smem-two_pass-c2-p0-m64"),
    (32768, "t512v8r1-bulk-two_pass-c2-p0-s2"),
]


def main() -> None:
    import sys

    import numpy as np

    lift_cluster_cap_rule()
    rng = np.random.default_rng(0)
    # Optional arguments HIDDEN:LABEL replace CASES (call G).
    cases = [(int(a.split(":")[0]), a.split(":")[1]) for a in sys.argv[1:]] or CASES
    for hidden, label in cases:
        problem, rows = Problem(hidden, "bfloat16"), (1 << 26) // hidden
        rendered = codegen.render(KernelConfig.from_label(label), problem, H200)
        kernel = compiler.compile_kernel(rendered, 0)
        x = cupy.asarray(from_float64(rng.standard_normal((rows, hidden)), problem.dtype))
        w = cupy.asarray(from_float64(1 + 0.1 * rng.standard_normal(hidden), problem.dtype))
        b = cupy.asarray(from_float64(0.1 * rng.standard_normal(hidden), problem.dtype))
        y = cupy.empty_like(x)
        for _ in range(3):
            kernel.launch_arrays(x, w, b, y, rows, 1e-5)
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        kernel.launch_arrays(x, w, b, y, rows, 1e-5)
        stop.record()
        stop.synchronize()
        us = cupy.cuda.get_elapsed_time(start, stop) * 1e3
        print(f"{hidden} {label} grid {kernel.grid(rows)} smem {rendered.launch.smem_bytes} "
              f"regs {kernel.attributes.get('num_regs')} resident "
              f"{getattr(kernel, 'resident_clusters', None)} {us:.1f} us", flush=True)
        cupy.cuda.runtime.profilerStart()
        kernel.launch_arrays(x, w, b, y, rows, 1e-5)
        cupy.cuda.runtime.deviceSynchronize()
        cupy.cuda.runtime.profilerStop()
        del x, y
        cupy.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
