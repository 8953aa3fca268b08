"""Lab only (session 24): evict_last's gain against the next kernel's loss, in one sequence.

Calls s24h-k: the bulk kernel's x copies hinted ``L2::evict_last`` run x1.02-1.05, and leave L2
holding x at high priority: a 40 MB re-read right after runs 1.5-3.6 us slower. Here the next
kernel is what follows a LayerNorm in a model, a GEMM reading y (torch.mm, y @ W with W of
hidden x 1024, bf16), timed in one sequence after a read flush: LayerNorm, then the GEMM, CUDA
events around each; the product's kernel and the evict_last tree's interleaved, verified first.

    python benchmarks/lab/l2hint_e2e.py --out $OUT --rounds 7   # trees as l2hint_lab.py
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import lab_eval
import torch
from tree_render import renderer

from autonorm.evaluator import GpuEvaluator
from autonorm.space import KernelConfig, Problem

HERE = Path(__file__).parent
SHAPES = [("bfloat16", 16384, 4096, "t256v8r1-bulk-two_pass-c1-p0-s3"),
          ("bfloat16", 32768, 2048, "t512v8r1-bulk-two_pass-c1-p0-s2")]


def sequence_us(kernel, work_ptr: int, xs, y, w, b, wg, out, flush, samples: int):  # noqa: ANN001, ANN201
    """Medians (us) of the LayerNorm, the GEMM after it, and both, each sample after a flush."""
    stream = torch.cuda.current_stream()
    ev = [[torch.cuda.Event(enable_timing=True) for _ in range(3)] for _ in range(samples)]
    for i, (e0, e1, e2) in enumerate(ev):
        flush.sum()
        e0.record(stream)
        kernel.launch(xs[i % len(xs)].data_ptr(), w.data_ptr(), b.data_ptr(), y.data_ptr(),
                      y.shape[0], 1e-5, stream.cuda_stream, work_ptr=work_ptr)
        e1.record(stream)
        torch.mm(y, wg, out=out)
        e2.record(stream)
    torch.cuda.synchronize()
    ln = statistics.median(a.elapsed_time(b) * 1e3 for a, b, _ in ev)
    gemm = statistics.median(b.elapsed_time(c) * 1e3 for _, b, c in ev)
    both = statistics.median(a.elapsed_time(c) * 1e3 for a, _, c in ev)
    return ln, gemm, both


def main() -> None:
    args = lab_eval.lab_arguments(offline=False).parse_args()
    render = renderer(HERE / "templates_evict_last")
    flush = torch.ones(4 * 60 * (1 << 20) // 4, dtype=torch.int32, device="cuda")
    records = []
    for dtype, hidden, rows, label in SHAPES:
        problem, cfg = Problem(hidden, dtype), KernelConfig.from_label(label)
        evs = {"prod": GpuEvaluator(problem, rows),
               "evict_last": lab_eval.RenderingEvaluator(render, problem, rows)}
        for name, e in evs.items():
            o = e.evaluate(cfg)
            assert o.status == "ok", (name, o.status, o.error)
        gen = torch.Generator(device="cuda").manual_seed(0)
        xs = [torch.randn(rows, hidden, device="cuda", generator=gen).to(torch.bfloat16)
              for _ in range(2)]
        y = torch.empty_like(xs[0])
        w = torch.ones(hidden, device="cuda", dtype=torch.bfloat16)
        b = torch.zeros(hidden, device="cuda", dtype=torch.bfloat16)
        wg = torch.randn(hidden, 1024, device="cuda", generator=gen).to(torch.bfloat16)
        out = torch.empty(rows, 1024, device="cuda", dtype=torch.bfloat16)
        kernels = {n: (e._compile(cfg), e._work.data.ptr) for n, e in evs.items()}  # noqa: SLF001
        per = {n: [] for n in kernels}
        for _ in range(args.rounds):
            for n, (k, work) in kernels.items():
                per[n].append(sequence_us(k, work, xs, y, w, b, wg, out, flush, 30))
        med = {n: tuple(statistics.median(r[i] for r in v) for i in range(3))
               for n, v in per.items()}
        p = med["prod"]
        for n, (ln, gemm, both) in med.items():
            print(f"{dtype:8s} {hidden:6d} rows {rows:5d} {n:10s} LayerNorm {ln:7.2f} us "
                  f"(x{p[0] / ln:.3f})  GEMM after it {gemm:7.2f} us (x{p[1] / gemm:.3f})  "
                  f"both {both:7.2f} us (x{p[2] / both:.3f})", flush=True)
            records.append(dict(dtype=dtype, hidden=hidden, rows=rows, variant=n, ln_us=ln,
                                gemm_us=gemm, both_us=both, rounds=per[n]))
        del evs, kernels
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "l2hint_e2e.json").write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
