"""Lab only: several rows per thread, so one weight/bias load serves them all.

Call A and B of session 9 (decompose_lab.py): the 16-bit smem winners run x1.03-1.04 faster at
12288-16384, and t512 at 32768 x1.07, on a problem without weight and bias; L1 evict_last on
those loads and more rows per block (each row group loading its own) did not recover it. Here
``templates_rt`` adds a kernel body where every thread of a block works on the same columns of
RT rows held in shared memory (filled by cp.async), reduces the RT rows' sums with one barrier
per pass, and loads each weight/bias vector once for the RT rows. The lab renders it through
autonorm's codegen (a template global ``RT_LAB``), launches ceil(rows / RT) blocks, verifies
every kernel against float64 with the product's verifier and times them interleaved.

Build the tree(s) first (templates_rt): ``benchmarks/lab/tree_patches/README.md``.
Run from the repo root on the GPU machine: ``python benchmarks/lab/rt_lab.py --out $OUT``.
``--offline`` compiles every planned kernel with nvcc instead (no GPU) and prints registers.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

from lab_eval import RenderingEvaluator, lab_arguments, run_plan
from tree_render import templates_from

from autonorm import codegen, compiler, space
from autonorm.space import H200, KernelConfig, Problem

LAB = Path(__file__).parent
TREE = LAB / "templates_rt"
W16 = "t256v8r1-smem-two_pass-c1-p0-m64"
PLAN: dict[tuple[str, int], list[tuple[str, int]]] = {
    ("bfloat16", 16384): [(W16, 1), (W16, 2), (W16, 4), ("t512v8r1-smem-two_pass-c1-p0-m64", 2),
                          ("t128v8r1-smem-two_pass-c1-p0-m64", 2)],
    ("float16", 16384): [(W16, 1), (W16, 2), (W16, 4), ("t512v8r1-smem-two_pass-c1-p0-m64", 2)],
    ("bfloat16", 12288): [(W16, 1), (W16, 2), (W16, 4), ("t512v8r1-smem-two_pass-c1-p0-m64", 2)],
    ("bfloat16", 32768): [("t512v8r1-bulk-two_pass-c1-p0-s2", 1),
                          ("t512v8r1-smem-two_pass-c1-p0-m64", 1),
                          ("t512v8r1-smem-two_pass-c1-p0-m64", 2),
                          ("t256v8r1-smem-two_pass-c1-p0-m64", 2),
                          ("t1024v8r1-smem-two_pass-c1-p0", 2)],
    ("bfloat16", 8192): [(W16, 1), (W16, 2), (W16, 4)],
    ("float32", 16384): [("t512v4r1-bulk-two_pass-c1-p0-s3", 1),
                         ("t512v4r1-smem-two_pass-c1-p0", 1), ("t512v4r1-smem-two_pass-c1-p0", 2),
                         ("t256v4r1-smem-two_pass-c1-p0", 2)],
    ("float32", 12288): [("t512v4r1-registers-two_pass-c1-p4", 1),
                         ("t256v4r1-smem-two_pass-c1-p0", 2),
                         ("t512v4r1-smem-two_pass-c1-p0", 2)],
}


def render_rt(config: KernelConfig, problem: Problem, limits: space.DeviceLimits = H200,
              *, rt: int) -> codegen.RenderedKernel:
    """``config`` rendered from ``templates_rt`` with RT rows per thread (RT 1: as shipped)."""
    if rt == 1:
        return codegen.render(config, problem, limits)
    with templates_from(TREE):
        codegen.template_environment().globals["RT_LAB"] = rt
        rendered = codegen.render(config, problem, limits)
    shape = space.derive_shape(config, problem)
    launch = dataclasses.replace(
        rendered.launch, rows_per_block=rt,
        smem_bytes=rt * shape.segment * problem.itemsize + space.SCRATCH_SMEM)
    name = f"{rendered.name}_rt{rt}"  # RT 1 and RT k of one config share codegen's name
    return dataclasses.replace(rendered, name=name, launch=launch,
                               source=rendered.source.replace(rendered.name, name))


def offline() -> None:
    for (dtype, hidden), items in PLAN.items():
        problem = Problem(hidden, dtype)
        kernels = [render_rt(KernelConfig.from_label(lab), problem, rt=rt) for lab, rt in items]
        reports = compiler.compile_offline(kernels, "sm_90")
        for (lab, rt), k in zip(items, kernels, strict=True):
            print(dtype, hidden, lab, f"RT{rt}", reports.get(k.name), flush=True)


def shape_entries(shape: tuple[tuple[str, int], list[tuple[str, int]]],
                  pool: compiler.CompilePool) -> tuple[str, int, list]:
    """One shape's entries: an evaluator per RT, each config under its RT."""
    (dtype, hidden), items = shape
    problem = Problem(hidden, dtype)
    evs: dict[int, RenderingEvaluator] = {}
    entries = []
    for lab, rt in items:
        if rt not in evs:
            evs[rt] = RenderingEvaluator(functools.partial(render_rt, rt=rt), problem,
                                         (1 << 26) // hidden, pool=pool)
        entries.append((f"RT{rt}", evs[rt], KernelConfig.from_label(lab)))
    return dtype, hidden, entries


def main() -> None:
    args = lab_arguments().parse_args()
    if args.offline:
        offline()
        return
    run_plan("rt_lab", PLAN.items(), shape_entries, args.rounds, args.out)


if __name__ == "__main__":
    main()
