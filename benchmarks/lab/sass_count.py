"""Count the SASS instructions of rendered kernels, for two template trees; no GPU needed.

Session 5 predicted its template changes from these counts before any device time (NOTES.md
23-24, 28): PRMT + SHF pairs showed the bf16 widening cost, and the counts matched the A/B's sign.

    python benchmarks/lab/sass_count.py --base /tmp/base_templates \
        bfloat16:1024:t32v8r1-registers-two_pass-c1-p0 bfloat16:16384:t256v8r1-bulk-two_pass-c1-p0-s3

Each spec is dtype:hidden:label (labels as ``KernelConfig.label()`` prints them). Needs nvcc and
cuobjdump (on PATH, beside nvcc, or the copy bundled with Triton).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from tree_render import templates_from

from autonorm import codegen
from autonorm.space import KernelConfig, Problem

OPS = ("FADD", "FFMA", "FMUL", "SHF", "PRMT", "LOP3", "IMAD", "HADD2", "F2FP", "SHFL", "LDS", "LDG")


def find_cuobjdump() -> str:
    """cuobjdump on PATH, beside nvcc, or bundled with Triton."""
    found = shutil.which("cuobjdump")
    nvcc = shutil.which("nvcc")
    if found is None and nvcc is not None:
        beside = Path(nvcc).resolve().parent / "cuobjdump"
        found = str(beside) if beside.exists() else None
    if found is None:
        try:
            import triton

            bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
            found = str(bundled) if bundled.exists() else None
        except ImportError:
            pass
    if found is None:
        raise SystemExit("cuobjdump not found (PATH, beside nvcc, or Triton's bundled copy)")
    return found


def count(source: str, cuobjdump: str) -> tuple[int, collections.Counter, str]:
    """Total SASS instructions, per-opcode counts and ptxas's resource line of one kernel."""
    with tempfile.TemporaryDirectory() as tmp:
        cu, cubin = Path(tmp) / "k.cu", Path(tmp) / "k.cubin"
        cu.write_text(source)
        ptxas = subprocess.run(
            ["nvcc", "-arch=sm_90", "-std=c++17", "-cubin", "-Xptxas", "-v", "-o", str(cubin),
             str(cu)], capture_output=True, text=True, check=True).stderr
        sass = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True,
                              check=True).stdout
    ops = re.findall(r"^\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P[0-9T] )?([A-Z0-9]+)", sass, re.M)
    used = re.findall(r"Used \d+ registers.*", ptxas)
    return len(ops), collections.Counter(ops), used[0] if used else ""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="", help="a template tree to compare with (default: none)")
    ap.add_argument("--no-affine", action="store_true",
                    help="without weight and bias (what widening them costs, by difference)")
    ap.add_argument("specs", nargs="+", help="dtype:hidden:label")
    args = ap.parse_args()
    cuobjdump = find_cuobjdump()
    trees = [("new", None)] + ([("base", Path(args.base).resolve())] if args.base else [])
    for spec in args.specs:
        dtype, hidden, label = spec.split(":", 2)
        problem = Problem(int(hidden), dtype, not args.no_affine, not args.no_affine)
        config = KernelConfig.from_label(label)
        for tag, tree in trees:
            with templates_from(tree) if tree is not None else contextlib.nullcontext():
                total, ops, used = count(codegen.render(config, problem).source, cuobjdump)
            detail = " ".join(f"{op} {ops[op]}" for op in OPS if ops[op])
            print(f"{tag:4s} {dtype:8s} {hidden:>6s} {label:40s} {total:5d}  {detail}  [{used}]")


if __name__ == "__main__":
    main()
