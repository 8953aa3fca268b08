"""Lab only: what is the fixed cost of a launch that linearity_lab.py found?

linearity_lab (session 13) fitted T = fixed + rows x per_row: per row the winners stream at
96.6-99.1% of copy, but each launch carries 5-8 us of fixed cost against copy's 1-2 us, which is
most of the gap at the peers' 2^26 elements. Candidates: a start cost of the kernel itself (the
SM's shared-memory carveout changed after the flush, which uses none; instruction fetch; the
prologue), or the pipeline's ramp and drain (nothing is stored until a whole row has arrived).

Each winner is timed as single launches after an L2 flush by a read, as the peers do, with
something enqueued between the flush and the timed launch:

- ``plain``: nothing (the peers' regime);
- ``pre_smem``: a do-nothing kernel with the winner's dynamic shared memory on every SM (sets
  the carveout; touches no data);
- ``pre_self``: the winner itself on a tiny problem of its own buffers (carveout, instruction
  cache, the bulk kernel's counter; 132 rows).

If ``pre_*`` removes most of the fixed cost, it is a start cost; if not, it is ramp and drain.
The copy of the same bytes is timed plain and after ``pre_smem`` too.

Run on the GPU machine: ``python benchmarks/lab/fixed_lab.py --out $OUT``.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import cupy
import lab_eval

from autonorm import bench
from autonorm.evaluator import GpuEvaluator
from autonorm.space import KernelConfig, Problem

SHAPES = (
    ("bfloat16", 4096, "t128v8r1-smem-two_pass-c1-p0-m64"),
    ("bfloat16", 16384, "t256v8r1-smem-two_pass-c1-p0-m64"),
    ("bfloat16", 32768, "t512v8r1-bulk-two_pass-c1-p0-s2"),
    ("bfloat16", 65536, "t512v8r1-bulk-two_pass-c2-p0-s3"),
)
SAMPLES = 20
DUMMY = r"""
extern "C" __global__ void dummy_smem(int* out) {
  extern __shared__ int s[];
  s[threadIdx.x] = threadIdx.x;
  __syncthreads();
  if (s[0] == 12345) out[0] = 1;  // never true: keeps the store of s alive
}
"""


def time_with(launch, pre, flush, stream, n_sets: int) -> float:
    """Median us of SAMPLES single launches, each after a flush and then ``pre`` (untimed)."""
    pairs = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(SAMPLES)]
    with stream:
        for i in range(2):
            flush.sum()
            launch(i % n_sets, stream.ptr)
        flush.sum()
        for i, (a, b) in enumerate(pairs):
            flush.sum()
            if pre is not None:
                pre(stream)
            a.record(stream)
            launch(i % n_sets, stream.ptr)
            b.record(stream)
    stream.synchronize()
    return statistics.median(cupy.cuda.get_elapsed_time(a, b) * 1e3 for a, b in pairs)


def main() -> None:
    args = lab_eval.lab_arguments(offline=False).parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dummy_fn = cupy.RawKernel(DUMMY, "dummy_smem")
    sink = cupy.zeros(1, dtype=cupy.int32)
    stream = cupy.cuda.Stream(non_blocking=True)
    records = []
    for dtype, hidden, label in SHAPES:
        problem, config = Problem(hidden, dtype), KernelConfig.from_label(label)
        rows = (1 << 26) // hidden
        ev = GpuEvaluator(problem, rows)
        small = GpuEvaluator(problem, 132)
        if ev.evaluate(config).status != "ok" or small.evaluate(config).status != "ok":
            print(dtype, hidden, label, "failed verification", flush=True)
            continue
        kernel = ev._compile(config)  # noqa: SLF001 - lab
        plan = kernel.plan
        launch = ev._launcher(kernel)  # noqa: SLF001
        launch_small = small._launcher(small._compile(config))  # noqa: SLF001
        smem = max(plan.smem_bytes, 4 * plan.threads)
        dummy_fn.max_dynamic_shared_size_bytes = smem

        def pre_smem(s, smem=smem, threads=plan.threads):
            dummy_fn((132 * 4,), (threads,), (sink,), shared_mem=smem, stream=s)

        def pre_self(s, launch_small=launch_small):
            launch_small(0, s.ptr)

        flush = bench._flush_buffer(0, bench.FLUSH_L2_MULTIPLE * ev.info.l2_bytes)  # noqa: SLF001
        copy_src = cupy.ones(ev.nbytes // 8, dtype=cupy.float32)
        copy = bench._copy_launch(copy_src)  # noqa: SLF001
        variants = {
            "plain": (launch, None), "pre_smem": (launch, pre_smem), "pre_self": (launch, pre_self),
            "copy": (copy, None), "copy_pre_smem": (copy, pre_smem),
        }
        per: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(args.rounds):
            for name, (fn, pre) in variants.items():
                per[name].append(time_with(fn, pre, flush, stream, ev.n_sets))
        med = {k: statistics.median(v) for k, v in per.items()}
        line = "  ".join(f"{k} {v:7.2f}" for k, v in med.items())
        print(f"{dtype:8s} {hidden:6d} {label:34s} us: {line}  share plain "
              f"{med['copy'] / med['plain'] * 100:5.1f}% pre_smem "
              f"{med['copy'] / med['pre_smem'] * 100:5.1f}% pre_self "
              f"{med['copy'] / med['pre_self'] * 100:5.1f}%", flush=True)
        records.append(dict(dtype=dtype, hidden=hidden, label=label, us=med, rounds=per))
        json.dump(records, open(out / "fixed_lab.json", "w"), indent=1)
        del ev, small, copy_src, copy
        lab_eval.free_gpu_memory()


if __name__ == "__main__":
    main()
