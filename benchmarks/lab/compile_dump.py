"""Dump the Triton kernels torch.compile runs for LayerNorm at chosen shapes (GPU machine).

    TORCHINDUCTOR_CACHE_DIR=$OUT/ind TRITON_CACHE_DIR=$OUT/tri \
        python benchmarks/lab/compile_dump.py float32:4096 bfloat16:1024

Compiles ``F.layer_norm`` as peers.py does (``dynamic=False``, weight and bias as arguments), runs
it at rows = 2^26 / hidden, and times it with CUDA events after an L2 flush (median of 50), so the
dump can be matched to the kernel peers.py measures. The generated Python (kernel source, launch
grid), the autotuner's chosen config (``*.best_config``) and the PTX / cubin land in the two cache
folders; the script prints the kernel names and timings. Measurement support only: nothing in the
product reads it.
"""

from __future__ import annotations

import statistics
import sys

import torch
import torch.nn.functional as F


def ln(x, w, b, eps: float):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


def main() -> None:
    compiled = torch.compile(ln, dynamic=False)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for spec in sys.argv[1:]:
        dtype, hidden = spec.split(":")[0], int(spec.split(":")[1])
        rows = (1 << 26) // hidden
        tdt = getattr(torch, dtype)
        x = torch.randn(rows, hidden, device="cuda", dtype=tdt)
        w = 1 + 0.1 * torch.randn(hidden, device="cuda", dtype=tdt)
        b = 0.1 * torch.randn(hidden, device="cuda", dtype=tdt)
        for _ in range(3):
            compiled(x, w, b, 1e-5)
        times = []
        for _ in range(50):
            flush.zero_()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            compiled(x, w, b, 1e-5)
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) * 1e3)
        us = statistics.median(times)
        gbs = 2 * x.numel() * x.element_size() / us / 1e3
        print(f"{dtype} {hidden}: compile {us:.1f} us, {gbs:.0f} GB/s", flush=True)


if __name__ == "__main__":
    main()
