"""Lab only: why bf16 16384 at rows 512 took 26.5 us a call host-inclusive in session 10's peers
run (14.9 us in session 9, same kernel time; the DB now stores bulk s4 where it stored s3).

For each candidate kernel of that shape: host enqueue time per call, the back-to-back loop time
per call (what peers.py's host-inclusive figure is) and the GPU time per call in a CUDA graph,
through the raw launch; then autonorm.torch and autonorm.layer_norm on the shipped choice.
"""

from __future__ import annotations

import torch
from host_probe import enqueue_us, gpu_us, loop_us

import autonorm
import autonorm.torch as at
from autonorm import codegen, compiler
from autonorm.device import query_device
from autonorm.space import KernelConfig, Problem

LABELS = ["t256v8r1-bulk-two_pass-c1-p0-s4", "t256v8r1-bulk-two_pass-c1-p0-s3",
          "t256v8r1-bulk-two_pass-c1-p0-s2", "t512v8r1-bulk-two_pass-c1-p0-s2",
          "t256v8r1-registers-two_pass-c1-p0", "t256v8r1-smem-two_pass-c1-p0-m64"]


def line(name: str, fn) -> None:
    fn()
    torch.cuda.synchronize()
    print(f"{name:40s} enqueue {enqueue_us(fn):6.2f} us  loop {loop_us(fn):6.2f} us  "
          f"graph-gpu {gpu_us(fn):6.2f} us", flush=True)


def main() -> None:
    hidden = 16384
    info = query_device()
    problem = Problem(hidden, "bfloat16", True, True)
    for rows in (512, 64):
        x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        sp = torch.cuda.current_stream().cuda_stream
        print(f"\nrows {rows}", flush=True)
        with torch.inference_mode():
            line("autonorm.torch.layer_norm", lambda: at.layer_norm(x, w, b))
            line("autonorm.layer_norm (torch path)", lambda: autonorm.layer_norm(x, w, b))
            line("torch eager", lambda: torch.nn.functional.layer_norm(x, (hidden,), w, b))
            line("torch.empty_like", lambda: torch.empty_like(x))
            for label in LABELS:
                k = compiler.compile_kernel(
                    codegen.render(KernelConfig.from_label(label), problem, info.limits()))
                g = k.grid(rows)

                def raw(k=k) -> None:
                    k.launch(x.data_ptr(), w.data_ptr(), b.data_ptr(), y.data_ptr(), rows,
                             1e-5, sp)
                line(f"raw {label} grid {g}", raw)


if __name__ == "__main__":
    main()
