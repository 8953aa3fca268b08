"""Does the L2 flush, and the copy's size, set the 16-bit share of copy? On the GPU.

peers.py times with triton's do_bench, which zeroes a 256 MB buffer before each launch: the L2
(60 MB on the H200) is then full of dirty lines that are written back during the timed kernel.
Its copy is a 2^28-byte buffer (2^29 bytes moved); the 16-bit sweep problems move half that.
If the write-back costs a fixed time, it weighs twice as much on the 16-bit problems.

For each subject (torch copies of several sizes, autonorm and torch.compile LayerNorms) this
times single launches between CUDA events after each of three preparations, interleaved launch
by launch so drift hits all alike:

- ``dirty``: zero a 256 MB buffer (do_bench's flush);
- ``clean``: read the same buffer (a sum): the L2 holds its clean lines, nothing to write back;
- ``none``: nothing (the previous launch's output is what the L2 holds).

Run from the repo root on the GPU machine: ``python benchmarks/lab/flush_lab.py --out $OUT``.
Prints one line per subject (median µs, GB/s per mode) and writes ``$OUT/flush_lab.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import peers  # noqa: E402

MODES = ("dirty", "clean", "none")
COPY_BUFFERS = (2**26, 2**27, 2**28, 2**29)
LN = (
    ("bf16", 768),
    ("bf16", 4096),
    ("bf16", 16384),
    ("bf16", 65536),
    ("fp32", 768),
    ("fp32", 16384),
)


def time_modes(fn, reps: int) -> dict[str, float]:
    """Median µs of single launches of ``fn`` after each preparation, interleaved."""
    flush = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device="cuda")
    flush.zero_()
    prep = {"dirty": flush.zero_, "clean": lambda: flush.sum(), "none": lambda: None}
    for _ in range(5):
        fn()
    times: dict[str, list[float]] = {m: [] for m in MODES}
    for _ in range(reps):
        for m in MODES:
            prep[m]()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times[m].append(a.elapsed_time(b) * 1e3)
    return {m: statistics.median(v) for m, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--out", default="/tmp/out")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records = []

    def report(name: str, moved: int, us: dict[str, float]) -> None:
        gbps = {m: moved / (t * 1e-6) / 1e9 for m, t in us.items()}
        records.append({"subject": name, "bytes_moved": moved, "us": us, "gbps": gbps})
        cells = "  ".join(f"{m} {us[m]:7.1f} us {gbps[m]:5.0f} GB/s" for m in MODES)
        print(f"{name:28s} {moved / 2**20:6.0f} MiB  {cells}", flush=True)

    for buf in COPY_BUFFERS:
        src = torch.randn(buf // 2, device="cuda", dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        report(f"copy {buf // 2**20} MiB", 2 * buf, time_modes(lambda: dst.copy_(src), args.reps))
    impls = peers.Impls(["autonorm", "compile"], "")
    for dt, hidden in LN:
        shape = peers.Shape("sweep", dt, hidden, peers.SWEEP_ELEMENTS // hidden)
        tdt = peers._torch_dtype(dt)
        x = torch.randn(shape.rows, hidden, device="cuda", dtype=tdt)
        w = (1 + 0.1 * torch.randn(hidden, device="cuda")).to(tdt)
        b = (0.1 * torch.randn(hidden, device="cuda")).to(tdt)
        for impl in ("autonorm", "compile"):
            fn, _ = impls.make(impl, shape, x, w, b, 1e-5)
            report(f"{impl} {dt} {hidden}", shape.bytes, time_modes(fn, args.reps))
        del x, w, b
        torch.cuda.empty_cache()
    (out / "flush_lab.json").write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
