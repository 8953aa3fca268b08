"""Lab only (session 24): is call s24h's evict_last gain real, and what does it cost the next kernel?

Call s24h: the bulk kernel's x copies hinted ``L2::evict_last`` ran x1.02-1.05 at nine bulk
winners, back to back and in single launches. Two ways that could mislead:

1. Reuse: lines hinted evict_last leave L2 only after the normal ones, so a flush by normal reads
   may not remove them, and a later launch over the same x could hit in L2. The evaluator rotates
   2 input sets at 2^26 elements; here also 4 (each set its own buffer).
2. Neighbours: after the kernel, L2 may hold x's lines at high priority, where the next kernel
   (a GEMM reading y, say) wants its own. After one launch, a victim buffer (16 and 40 MB) is read
   twice and the second read timed: it should hit L2, and after the product's kernel it does.
   Call s24i read it with ``cupy.sum`` (1.3-1.7 TB/s: not bandwidth-bound, a blunt probe); call
   s24j with a 16-byte-load reader, and adds ``evict_last_reset`` (each landed tile's x lines
   set back to evict_normal by ``applypriority``, tree patch ``s24_x_evict_last_reset.patch``
   over ``templates_evict_last``). Call s24k: ``--trees evict_last,evict_last_half,
   evict_last_quarter`` (the policy's fraction 1.0, 0.5, 0.25): the gain against the penalty.

    python benchmarks/lab/l2hint_probe.py --out $OUT   # GPU machine, trees as l2hint_lab.py
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import lab_eval
from tree_render import renderer

from autonorm import bench
from autonorm.evaluator import GpuEvaluator
from autonorm.space import KernelConfig, Problem

HERE = Path(__file__).parent
SHAPES = [("bfloat16", 32768, "t512v8r1-bulk-two_pass-c1-p0-s2"),
          ("float32", 32768, "t256v4r1-bulk-two_pass-c4-p0-s3"),
          ("bfloat16", 16384, "t256v8r1-bulk-two_pass-c1-p0-s3")]


def rotate(ev: GpuEvaluator, n_sets: int) -> None:
    """Give ``ev`` ``n_sets`` input sets, each its own buffer (rows rolled, so not equal)."""
    import cupy

    x0 = ev._xs[0]  # noqa: SLF001
    ev._xs = [x0] + [cupy.roll(x0, k + 1, axis=0) for k in range(n_sets - 1)]  # noqa: SLF001
    ev._ys = [cupy.empty_like(x0) for _ in range(n_sets)]  # noqa: SLF001
    ev.n_sets = n_sets


READER = r"""
extern "C" __global__ void read_all(const int4* __restrict__ p, unsigned long long n, int* out) {
  int acc = 0;
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x) {
    const int4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x7fffffff) *out = acc;  // never (the buffer is ones): keeps the loads
}
"""


def victim_us(ev: GpuEvaluator, config: KernelConfig | None, victim_mb: int,
              samples: int = 25) -> float:
    """Median time of a second read of a ``victim_mb`` buffer right after one launch."""
    import cupy

    reader = cupy.RawKernel(READER, "read_all")

    launch = ev._launcher(ev._compile(config)) if config else None  # noqa: SLF001
    flush = cupy.ones(bench.FLUSH_L2_MULTIPLE * ev.info.l2_bytes // 4, dtype=cupy.int32)
    v = cupy.ones(victim_mb * (1 << 20) // 4, dtype=cupy.int32)
    stream = cupy.cuda.Stream(non_blocking=True)
    pairs = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(samples)]
    out = cupy.zeros(1, dtype=cupy.int32)
    n = cupy.uint64(v.size // 4)

    def read() -> None:
        reader((132 * 8,), (256,), (v, n, out))

    with stream:
        for i, (a, b) in enumerate(pairs):
            flush.sum()
            if launch:
                launch(i % ev.n_sets, stream.ptr)
            read()
            a.record(stream)
            read()
            b.record(stream)
    stream.synchronize()
    return statistics.median(cupy.cuda.get_elapsed_time(a, b) * 1e3 for a, b in pairs)


def main() -> None:
    ap = lab_eval.lab_arguments(offline=False)
    ap.add_argument("--trees", default="evict_last,evict_last_reset",
                    help="tree suffixes, comma-separated (templates_<tree>)")
    args = ap.parse_args()
    trees = tuple(args.trees.split(","))
    records = []
    for dtype, hidden, label in SHAPES:
        problem, rows = Problem(hidden, dtype), (1 << 26) // hidden
        cfg = KernelConfig.from_label(label)
        evs = {"prod": GpuEvaluator(problem, rows)} | {
            t: lab_eval.RenderingEvaluator(renderer(HERE / f"templates_{t}"), problem, rows)
            for t in trees}
        for name, ev in evs.items():
            o = ev.evaluate(cfg)
            assert o.status == "ok", (name, o.status, o.error)
        for n_sets in (2,):
            for ev in evs.values():
                rotate(ev, n_sets)
            t = {name: [] for name in evs}
            for _ in range(args.rounds):
                for name, ev in evs.items():
                    t[name].append(ev.time_single(cfg).median_us)
            us = {name: statistics.median(v) for name, v in t.items()}
            print(f"{dtype:8s} {hidden:6d} {label:36s} sets {n_sets}: " + ", ".join(
                f"{k} {v:7.2f} us x{us['prod'] / v:.3f}" for k, v in us.items()), flush=True)
            records.append(dict(dtype=dtype, hidden=hidden, label=label, sets=n_sets, **us))
        for mb in (16, 40):
            ev = evs["prod"]
            base = victim_us(ev, None, mb)
            after = {name: victim_us(e, cfg, mb) for name, e in evs.items()}
            print(f"{dtype:8s} {hidden:6d} victim {mb} MB second read: after a flush only "
                  f"{base:6.2f} us, " + ", ".join(f"after {k} {v:6.2f} us"
                                                  for k, v in after.items()), flush=True)
            records.append(dict(dtype=dtype, hidden=hidden, victim_mb=mb, flush_only=base,
                                **{f"after_{k}": v for k, v in after.items()}))
        del evs
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "l2hint_probe.json").write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
