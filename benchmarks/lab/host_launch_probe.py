"""Lab only: where autonorm's raw launch spends its 7.2 us (NOTES.md 62).

bf16 16384, rows 8, the shipped kernel, torch's current stream. Host time per launch, bursts of
200 without synchronization inside the window (the GPU queue does not fill), median of 15:

- ``C loop``: cuLaunchKernel from C (``launch_loop.c``, built here with gcc): the driver's cost;
- ``ctypes``: the product's ctypes launcher called directly with ready arguments;
- ``launch()``: ``CompiledKernel.launch`` (grid, counter, the ctypes call);
- ``autonorm.layer_norm``: the whole call on torch tensors (validation, ``empty_like``, launch);
- eager's ``layer_norm`` for scale.

Each is printed twice, before and after a burn of host work, since the host's state moved the
figures 1.5-2x in session 12 (calls F-G). ``--rows 512`` takes the bulk kernel (session 14), whose
launch also asks ``workspace.counter_for`` for its tile counter: that is timed too, and so is
``torch.empty_like`` of the input (the call's output allocation).
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import time
from pathlib import Path

import host_probe
import torch

import autonorm
from autonorm import torch as at
from autonorm import workspace

HERE = Path(__file__).resolve().parent
HIDDEN = 16384


def enqueue_us(fn) -> float:
    """Host time per call: host_probe's enqueue timer, bursts of 200, median of 15."""
    return host_probe.enqueue_us(fn, calls=200, repeats=15)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8)
    rows = ap.parse_args().rows
    so = Path("/tmp/launch_loop.so")
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(so),
                    str(HERE / "launch_loop.c"), "-ldl"], check=True)
    lib = ctypes.CDLL(str(so))
    lib.launch_loop.restype = ctypes.c_double
    lib.launch_loop.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_uint,
                                ctypes.c_uint, ctypes.c_void_p] + [ctypes.c_uint64] * 4 + [
                                    ctypes.c_int, ctypes.c_float, ctypes.c_uint64]
    x = torch.randn(rows, HIDDEN, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(HIDDEN, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(HIDDEN, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    with torch.inference_mode():
        autonorm.layer_norm(x, w, b, 1e-5)
        kernel = next(k for key, k in at._KERNELS.items() if key[2] == HIDDEN and key[5] == rows)
        print("kernel", kernel.rendered.config.label(), flush=True)
        sp = torch.cuda.current_stream().cuda_stream
        grid, plan = kernel.grid(rows), kernel.plan
        drv = kernel._driver
        args = (x.data_ptr(), w.data_ptr(), b.data_ptr(), y.data_ptr(), rows, 1e-5)

        def c_loop() -> float:
            torch.cuda.synchronize()
            per = [lib.launch_loop(drv._fn, 200, grid, plan.threads, plan.smem_bytes, sp, *args,
                                   0) for _ in range(15)]
            torch.cuda.synchronize()
            return statistics.median(per)

        for tag in ("first", "after a burn"):
            if tag != "first":
                t0 = time.perf_counter()
                while time.perf_counter() - t0 < 5.0:  # host work, as a sweep's setup would be
                    sum(i * i for i in range(10_000))
            line = {
                "C loop": c_loop(),
                "ctypes": enqueue_us(lambda: drv(grid, plan.threads, plan.smem_bytes, sp,
                                                 *args, 0)),
                "launch()": enqueue_us(lambda: kernel.launch(*args, sp)),
                "counter_for": enqueue_us(lambda: workspace.counter_for(0, sp)),
                "empty_like": enqueue_us(lambda: torch.empty_like(x)),
                "autonorm.layer_norm": enqueue_us(lambda: autonorm.layer_norm(x, w, b, 1e-5)),
                "eager": enqueue_us(lambda: torch.nn.functional.layer_norm(x, (HIDDEN,), w, b)),
            }
            print(f"{tag:14s} " + "  ".join(f"{k} {v:5.2f} us" for k, v in line.items()),
                  flush=True)


if __name__ == "__main__":
    main()
