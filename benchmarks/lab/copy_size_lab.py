"""Lab only: does the tuner's copy reference depend on the few bytes of weight and bias?

The tuner's finals divide by a copy of the problem's own bytes (``bench.single_copy_gbps``: x,
y, weight and bias, so 2^27 bytes plus a few KB for a 16-bit 2^26-element problem). In 82's
re-tune that copy read 3,982-3,989 GB/s at hidden 768 and 1024 (16-bit) and 4,149-4,157 (fp32)
against 4,181-4,267 at 2048 and up, so the shipped DB shows shares of 100.5-103.8% there. This
times cudaMemcpyAsync the way the finals do (``bench.time_single_launches``: single launches
after an L2 flush by a read), at the sizes the finals used and at the bare powers of two,
interleaved over rounds, 30 launches each.

Run on the GPU machine: ``python benchmarks/lab/copy_size_lab.py --out $OUT``.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import cupy
import lab_eval

from autonorm import bench

# (name, bytes copied): half of bench.bytes_moved for the grid's problems at 2^26 elements.
SIZES = []
for itemsize, tag in ((2, "16-bit"), (4, "fp32")):
    base = (1 << 26) * itemsize
    for hidden in (0, 768, 1024, 2048, 4096, 16384):
        SIZES.append((f"{tag} x + {hidden} w/b", base + hidden * itemsize))


def main() -> None:
    args = lab_eval.lab_arguments(offline=False).parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info = cupy.cuda.runtime.getDeviceProperties(0)
    flush = bench.FLUSH_L2_MULTIPLE * info["l2CacheSize"]
    launches = {}
    for name, nbytes in SIZES:
        src = cupy.ones(nbytes // 4, dtype=cupy.float32)
        launches[name] = (bench._copy_launch(src), 2 * src.nbytes)
    gbps: dict[str, list[float]] = {name: [] for name, _ in SIZES}
    for _ in range(args.rounds):
        for name, (launch, moved) in launches.items():
            t = bench.time_single_launches(launch, moved, 1, flush_bytes=flush, samples=30)
            gbps[name].append(t.gbps)
    rows = []
    for name, nbytes in SIZES:
        med = statistics.median(gbps[name])
        rows.append({"name": name, "bytes": nbytes, "median_gbps": med, "rounds": gbps[name]})
        print(f"{name:24s} {nbytes:11d} B  {med:7.0f} GB/s  rounds "
              + " ".join(f"{g:.0f}" for g in gbps[name]), flush=True)
    (out / "copy_size_lab.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
