"""Verify-then-time for lab scripts that compare kernel variants of one shape (lab only).

decompose_lab.py, rt_lab.py, p3_lab.py and cluster_cap_lab.py each build, per shape, a list of
(name, evaluator, config) entries; :func:`run_plan` runs the shapes in turn, and
:func:`compare` verifies every entry with the product's evaluator, times the verified ones
interleaved (round-robin) and reports each against the first. :func:`run_tree_lab` is the whole of a lab
that compares the product with one other template tree (dyn_lab, fwdd_lab, t16_lab).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from autonorm import codegen, compiler
from autonorm.evaluator import GpuEvaluator
from autonorm.space import H200, DeviceLimits, KernelConfig, Problem

Render = Callable[[KernelConfig, Problem, DeviceLimits], codegen.RenderedKernel]


class RenderingEvaluator(GpuEvaluator):
    """The product's evaluator, rendering through ``render`` (a lab's variant of codegen)."""

    def __init__(self, render: Render, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._render_variant = render

    def _render(self, config: KernelConfig) -> codegen.RenderedKernel:
        if config not in self._rendered:
            self._rendered[config] = self._render_variant(config, self.problem, self.limits)
        return self._rendered[config]


Entry = tuple[str, GpuEvaluator, KernelConfig]
# Builds one shape's entries (evaluators compile in the pool): (dtype, hidden, entries).
EntriesFor = Callable[[Any, compiler.CompilePool], tuple[str, int, list[Entry]]]


def lab_arguments(offline: bool = True) -> argparse.ArgumentParser:
    """The options every comparing lab takes: --rounds, --out and (optionally) --offline."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="/tmp/out")
    if offline:
        ap.add_argument("--offline", action="store_true",
                        help="compile the plan with nvcc instead (registers, spills; no GPU)")
    return ap


def run_plan(name: str, shapes: Iterable[Any], entries_for: EntriesFor, rounds: int,
             out: str) -> list[dict]:
    """Compare each shape's entries in turn; ``out/<name>.json`` is rewritten after every shape.

    A shape's evaluators (and their rotated inputs) are released before the next shape's.
    """
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    pool = compiler.CompilePool()
    records: list[dict] = []
    try:
        for shape in shapes:
            dtype, hidden, entries = entries_for(shape, pool)
            records += compare(dtype, hidden, entries, rounds)
            json.dump(records, open(out_dir / f"{name}.json", "w"), indent=1)
            del entries
            free_gpu_memory()
    finally:
        pool.close()
    return records


def run_tree_lab(name: str, plan: dict[tuple[str, int], list[tuple[str, str]]], tag: str,
                 render: Render, describe: Callable[[codegen.RenderedKernel], str] | None = None,
                 ) -> None:
    """The two-tree lab: each shape's (variant, label) entries, ``"prod"`` through the product's
    evaluator and ``tag`` through ``render``, compared by :func:`run_plan` at rows = 2^26 / hidden.

    With ``--offline`` the ``tag`` kernels are compiled with nvcc instead and each printed with
    its registers and spill stores (and ``describe(kernel)``, if given); no GPU.
    """
    args = lab_arguments().parse_args()
    if args.offline:
        kernels = [render(KernelConfig.from_label(label), Problem(h, d), H200)
                   for (d, h), entries in plan.items() for t, label in entries if t == tag]
        reports = compiler.compile_offline(kernels, "sm_90")
        for k in kernels:
            r = reports[k.name]
            print(k.problem.dtype, k.problem.hidden, k.config.label(), "registers", r.registers,
                  "spill stores", r.spill_stores, "smem", k.launch.smem_bytes,
                  "blocks/SM", k.launch.blocks_per_sm, describe(k) if describe else "")
        return

    def entries_for(shape: Any, pool: compiler.CompilePool) -> tuple[str, int, list[Entry]]:
        (dtype, hidden), entries = shape
        problem, rows = Problem(hidden, dtype), (1 << 26) // hidden
        evs = {"prod": GpuEvaluator(problem, rows, pool=pool),
               tag: RenderingEvaluator(render, problem, rows, pool=pool)}
        return dtype, hidden, [(t, evs[t], KernelConfig.from_label(label)) for t, label in entries]

    run_plan(name, plan.items(), entries_for, args.rounds, args.out)


def run_trees_lab(name: str, plan: dict[tuple[str, int], list[tuple[str, str]]],
                  renders: dict[str, Render], args: argparse.Namespace) -> None:
    """The many-tree lab: each shape's (variant, label) entries, a variant named in ``renders``
    through that tree and any other through the product, compared by :func:`run_plan` at rows =
    2^26 / hidden (delay_lab, l2hint_lab). With ``args.offline`` each tree's kernels are
    compiled with nvcc instead (one tree a batch: the trees' kernels share names) and printed
    with their registers and spill stores; no GPU.
    """
    if args.offline:
        for t, render in renders.items():
            kernels = [render(KernelConfig.from_label(label), Problem(h, d), H200)
                       for (d, h), entries in plan.items() for tt, label in entries if tt == t]
            reports = compiler.compile_offline(kernels, "sm_90")
            for k in kernels:
                r = reports[k.name]
                print(t, k.problem.dtype, k.problem.hidden, k.config.label(), "registers",
                      r.registers, "spill stores", r.spill_stores)
        return

    def entries_for(shape: Any, pool: compiler.CompilePool) -> tuple[str, int, list[Entry]]:
        (dtype, hidden), entries = shape
        problem, rows = Problem(hidden, dtype), (1 << 26) // hidden
        prod = GpuEvaluator(problem, rows, pool=pool)
        evs = {t: RenderingEvaluator(r, problem, rows, pool=pool) for t, r in renders.items()}
        return dtype, hidden, [(t, evs.get(t, prod), KernelConfig.from_label(label))
                               for t, label in entries]

    run_plan(name, plan.items(), entries_for, args.rounds, args.out)


def run_label_lab(name: str, plan: dict[tuple[str, int], list[str]], tag: str) -> None:
    """The one-tree lab: each shape's configs (labels) through the product's evaluator, the
    first named ``"ship"`` (the shipped winner, the reference) and the rest ``tag``, compared by
    :func:`run_plan` at rows = 2^26 / hidden. With ``--offline`` every kernel is compiled with
    nvcc instead and printed with its registers and spill stores; no GPU.
    """
    args = lab_arguments().parse_args()
    if args.offline:
        kernels = [codegen.render(KernelConfig.from_label(label), Problem(h, d), H200)
                   for (d, h), labels in plan.items() for label in labels]
        reports = compiler.compile_offline(kernels, "sm_90")
        for k in kernels:
            r = reports[k.name]
            print(k.problem.dtype, k.problem.hidden, f"{k.config.label():40s}", "registers",
                  r.registers, "spill stores", r.spill_stores)
        return

    def entries_for(shape: Any, pool: compiler.CompilePool) -> tuple[str, int, list[Entry]]:
        (dtype, hidden), labels = shape
        ev = GpuEvaluator(Problem(hidden, dtype), (1 << 26) // hidden, pool=pool)
        return dtype, hidden, [("ship" if i == 0 else tag, ev, KernelConfig.from_label(lb))
                               for i, lb in enumerate(labels)]

    run_plan(name, plan.items(), entries_for, args.rounds, args.out)


def compare(dtype: str, hidden: int, entries: Sequence[Entry], rounds: int) -> list[dict]:
    """Verify ``entries``, time the verified ones interleaved, print and return one record each.

    A record holds the median of ``rounds`` medians (10 launches each), the share of copy
    bandwidth, the speedup over the first verified entry, registers and the verifier's error;
    then the same in the finals' single-launch regime (``*_single``: 20 launches a round, each
    after an L2 flush, share of a same-bytes copy timed that way).
    """
    for _, e, c in entries:
        e.prepare([c])
    ok = []
    for name, e, c in entries:
        o = e.evaluate(c)
        if o.status != "ok":
            print(f"{dtype:8s} {hidden:6d} {name:6s} {c.label():40s} {o.status}: "
                  f"{(o.error or '')[:300]}", flush=True)
            continue
        regs = e._compile(c).attributes.get("num_regs")  # noqa: SLF001
        ok.append((name, e, c, regs, o.max_rel_err))
    per: dict[tuple[str, KernelConfig], list[float]] = {(n, c): [] for n, _, c, *_ in ok}
    single: dict[tuple[str, KernelConfig], list[Any]] = {(n, c): [] for n, _, c, *_ in ok}
    for _ in range(rounds):
        for name, e, c, *_ in ok:
            per[name, c].append(e.time(c, samples=10).median_us)
            single[name, c].append(e.time_single(c))
    first = statistics.median(per[ok[0][0], ok[0][2]]) if ok else float("nan")
    first_single = (statistics.median(t.median_us for t in single[ok[0][0], ok[0][2]])
                    if ok else float("nan"))
    records = []
    for name, e, c, regs, err in ok:
        us = statistics.median(per[name, c])
        share = e.nbytes / (us * 1e-6) / 1e9 / e.copy_gbps
        us1 = statistics.median(t.median_us for t in single[name, c])
        share1 = e.nbytes / (us1 * 1e-6) / 1e9 / single[name, c][0].copy_gbps
        records.append(dict(dtype=dtype, hidden=hidden, variant=name, label=c.label(), us=us,
                            share=share, speedup=first / us, regs=regs, err=err,
                            rounds=per[name, c], copy_gbps=e.copy_gbps, us_single=us1,
                            share_single=share1, speedup_single=first_single / us1,
                            rounds_single=[t.median_us for t in single[name, c]],
                            copy_gbps_single=single[name, c][0].copy_gbps))
        print(f"{dtype:8s} {hidden:6d} {name:6s} {c.label():40s} {us:7.2f} us "
              f"{share * 100:5.1f}% x{first / us:.3f} | single {us1:7.2f} us "
              f"{share1 * 100:5.1f}% x{first_single / us1:.3f} | regs {regs} err {err:.1e}",
              flush=True)
    return records


def time_at_rows(problem: Problem, config: KernelConfig, row_counts: Iterable[int],
                 rounds: int) -> dict[int, tuple[GpuEvaluator, list[Any]]]:
    """One config at several row counts: verify each, then single launches interleaved.

    Returns {rows: (its evaluator, a Timing a round)} for the row counts that verified
    (tail_lab, linearity_lab); a failed verification is printed and left out.
    """
    evs = {}
    for rows in row_counts:
        ev = GpuEvaluator(problem, rows)
        o = ev.evaluate(config)
        if o.status != "ok":
            print(problem, config.label(), rows, o.status, o.error, flush=True)
            continue
        evs[rows] = ev
    per: dict[int, list[Any]] = {r: [] for r in evs}
    for _ in range(rounds):
        for r, ev in evs.items():
            per[r].append(ev.time_single(config))
    return {r: (evs[r], per[r]) for r in evs}


def free_gpu_memory() -> None:
    """Return the shape's buffers to the device before the next shape allocates its own."""
    import cupy

    cupy.get_default_memory_pool().free_all_blocks()
