"""Where the time of a rows=1 call goes: host enqueue cost (no sync inside the window) versus
GPU-bound loop time, for autonorm.torch, the raw launch, torch eager and the Triton tutorial."""

from __future__ import annotations

import statistics
import time

import torch

import autonorm.torch as at


def enqueue_us(fn, calls=300, repeats=7):
    """Host time per call for a burst short enough not to fill the launch queue."""
    out = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) / calls)
        torch.cuda.synchronize()
    return statistics.median(out) * 1e6


def loop_us(fn, calls=3000):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def gpu_us(fn, calls=200):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    g = torch.cuda.CUDAGraph()
    fn()
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    s.record()
    g.replay()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) * 1e3 / calls


def main():
    import torch.nn.functional as F

    for hidden in (4096, 16384):
        x = torch.randn(1, hidden, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
        fns = {
            "autonorm.torch": lambda: at.layer_norm(x, w, b),
            "eager": lambda: F.layer_norm(x, (hidden,), w, b, 1e-5),
        }
        try:
            import sys
            sys.path.insert(0, "benchmarks")
            import triton_tutorial_ln  # type: ignore

            fns["triton"] = lambda: triton_tutorial_ln.layer_norm(x, w, b, 1e-5)
        except Exception as exc:  # noqa: BLE001
            print("no triton peer:", type(exc).__name__, exc)
        with torch.inference_mode():
            for name, fn in fns.items():
                fn()
                print(f"hidden {hidden:6d} {name:15s} enqueue {enqueue_us(fn):6.2f} us  "
                      f"loop {loop_us(fn):6.2f} us  graph-gpu {gpu_us(fn):6.2f} us", flush=True)
            key = next(k for k in at._KERNELS if k[2] == hidden)
            k = at._KERNELS[key]
            print("   kernel:", k.rendered.config.label(), "grid", k.grid(1))
            y = torch.empty_like(x)
            sp = torch.cuda.current_stream().cuda_stream
            raw = lambda: k.launch(x.data_ptr(), w.data_ptr(), b.data_ptr(), y.data_ptr(), 1,
                                   1e-5, sp)
            print(f"hidden {hidden:6d} {'raw launch':15s} enqueue {enqueue_us(raw):6.2f} us  "
                  f"loop {loop_us(raw):6.2f} us  graph-gpu {gpu_us(raw):6.2f} us", flush=True)
            print(f"hidden {hidden:6d} {'empty_like':15s} enqueue "
                  f"{enqueue_us(lambda: torch.empty_like(x)):6.2f} us", flush=True)


if __name__ == "__main__":
    main()
