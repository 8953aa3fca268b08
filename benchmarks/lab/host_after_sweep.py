"""Lab only: does autonorm's host-inclusive latency rise after a sweep in the same process?

Session 12, call E ran peers.py's latency suite after the sweep and read 22-28 us a call for
autonorm at bf16 16384 rows 1-64 (14-15 us in earlier warm runs), eager ~20 us. Here, in one
process: the back-to-back loop per call (peers.py's host-inclusive method) for autonorm and eager
fresh, after autonorm alone ran the 27 sweep shapes, and after eager and torch.compile ran them
too; then a cProfile of autonorm's calls at rows 8.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import statistics
import time

import torch

import autonorm

HIDDEN = 16384
DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def loop_us(fn, calls: int = 200, reps: int = 15) -> float:
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) / calls)
    return statistics.median(out) * 1e6


def enqueue_us(fn, calls: int = 200, reps: int = 15) -> float:
    """Host time per call without waiting for the GPU (the queue is far from full at 200)."""
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) / calls)
    torch.cuda.synchronize()
    return statistics.median(out) * 1e6


def breakdown(tag: str) -> None:
    """Where a call's time goes at rows 8: enqueue of the whole call, torch.empty_like, and the
    cached kernel's raw launch (ctypes cuLaunchKernel)."""
    from autonorm import torch as at

    x = torch.randn(8, HIDDEN, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(HIDDEN, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(HIDDEN, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    autonorm.layer_norm(x, w, b, 1e-5)
    kernel = next(k for key, k in at._KERNELS.items() if key[2] == HIDDEN and key[5] == 8)
    sp = torch.cuda.current_stream().cuda_stream
    raw = (lambda: kernel.launch(x.data_ptr(), w.data_ptr(), b.data_ptr(), y.data_ptr(), 8,
                                 1e-5, sp))
    print(f"{tag:34s} r8 enqueue: call {enqueue_us(lambda: autonorm.layer_norm(x, w, b, 1e-5)):5.1f}"
          f"  empty_like {enqueue_us(lambda: torch.empty_like(x)):5.1f}"
          f"  raw launch {enqueue_us(raw):5.1f}  raw loop {loop_us(raw):5.1f}"
          f"  eager enqueue {enqueue_us(lambda: torch.nn.functional.layer_norm(x, (HIDDEN,), w, b)):5.1f}",
          flush=True)


def report(tag: str) -> None:
    breakdown(tag)
    w = torch.randn(HIDDEN, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(HIDDEN, device="cuda", dtype=torch.bfloat16)
    parts = []
    for rows in (1, 8, 64, 512):
        x = torch.randn(rows, HIDDEN, device="cuda", dtype=torch.bfloat16)
        a = loop_us(lambda: autonorm.layer_norm(x, w, b, 1e-5))
        e = loop_us(lambda: torch.nn.functional.layer_norm(x, (HIDDEN,), w, b, 1e-5))
        parts.append(f"r{rows} autonorm {a:5.1f} eager {e:5.1f}")
    print(f"{tag:34s} " + " | ".join(parts), flush=True)


def sweep(impls: tuple[str, ...]) -> None:
    compiled = torch.compile(torch.nn.functional.layer_norm)
    for dt in ("bf16", "fp16", "fp32"):
        for h in (768, 1024, 2048, 4096, 8192, 12288, 16384, 32768, 65536):
            x = torch.randn((1 << 26) // h, h, device="cuda", dtype=DT[dt])
            w = torch.randn(h, device="cuda", dtype=DT[dt])
            b = torch.randn(h, device="cuda", dtype=DT[dt])
            for _ in range(20):
                if "autonorm" in impls:
                    autonorm.layer_norm(x, w, b, 1e-5)
                if "eager" in impls:
                    torch.nn.functional.layer_norm(x, (h,), w, b, 1e-5)
                if "compile" in impls:
                    compiled(x, (h,), w, b, 1e-5)
            torch.cuda.synchronize()
            del x


def main() -> None:
    with torch.inference_mode():
        report("fresh")
        report("fresh, again")
        t0 = time.perf_counter()
        sweep(("autonorm",))
        print(f"autonorm sweep {time.perf_counter() - t0:.1f} s", flush=True)
        report("after autonorm's sweep")
        t0 = time.perf_counter()
        sweep(("eager", "compile"))
        print(f"eager+compile sweep {time.perf_counter() - t0:.1f} s", flush=True)
        report("after eager and compile's sweep")
        torch.cuda.empty_cache()
        report("after empty_cache")
        x = torch.randn(8, HIDDEN, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(HIDDEN, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(HIDDEN, device="cuda", dtype=torch.bfloat16)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(3000):
            autonorm.layer_norm(x, w, b, 1e-5)
        torch.cuda.synchronize()
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(18)
        print(s.getvalue()[-3500:], flush=True)


if __name__ == "__main__":
    main()
