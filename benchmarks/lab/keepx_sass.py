"""Lab (session 26, call F): the fp32 fwd kernels with keep_x that raise an illegal instruction.

Call E (``keepx_diag.py``) found every fp32 two-pass one-row smem kernel filled by hinted
cp.async faulting (4-, 8- and 16-byte fills; ITERS 8-64; a persistent grid too), while their
plain twins, the Welford and two-row forms and every 16-bit one verified. compute-sanitizer put
the fault at offset 0x360 of t128v2r1, right after the fill's LDGDEPBAR. This verifies each
config in a process of its own as rendered and with the createpolicy asm made volatile (as the
bulk kernel's is), and writes the SASS that NVRTC made of each (cuobjdump) to --sass.

    python benchmarks/lab/keepx_sass.py --sass OUT.txt HIDDEN:DTYPE:LABEL ...     # GPU machine

Not yet run past the refusal (call F's try stopped at it); ready for the next session.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

CHILD = """
import dataclasses, glob, os, subprocess, sys
from autonorm import codegen, compiler
from autonorm.space import KernelConfig, Problem
from autonorm.verify import verify
h, d, label, patch, sass = sys.argv[1:6]
# space.check refuses these configs since call E: render them anyway (a lab, on known labels).
# Call F's first try lacked this line, so every child stopped at the refusal.
codegen.require_valid = lambda *args, **kwargs: None
p = Problem(int(h), d)
r = codegen.render(KernelConfig.from_label(label), p)
if patch == "volatile":
    old = 'asm("createpolicy'
    assert old in r.source
    r = dataclasses.replace(r, source=r.source.replace(old, 'asm volatile("createpolicy'))
k = compiler.compile_kernel(r)
if sass != "-":
    # CuPy's disk cache holds the cubin after a hash header: cut at the ELF magic.
    newest = max(glob.glob(os.environ["CUPY_CACHE_DIR"] + "/*"), key=os.path.getmtime)
    data = open(newest, "rb").read()
    open("/tmp/k.cubin", "wb").write(data[data.index(b"\\x7fELF"):])
    out = subprocess.run(["cuobjdump", "-sass", "/tmp/k.cubin"], capture_output=True, text=True)
    with open(sass, "a") as f:
        f.write(f"==== {h} {d} {label} {patch}\\n" + out.stdout + out.stderr)
res = verify(k, p)
print("ok" if res.ok else "WRONG " + res.summary())
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sass", default="-", help="file the SASS of each kernel is added to")
    parser.add_argument("specs", nargs="+")
    args = parser.parse_args()
    for n, spec in enumerate(args.specs):
        h, d, label = spec.split(":")
        for patch in ("as-rendered", "volatile"):
            env_cache = f"/tmp/keepx_sass_cache_{n}_{patch}"
            out = subprocess.run(
                [sys.executable, "-c", CHILD, h, d, label, patch,
                 args.sass if n < 3 else "-"],
                capture_output=True, text=True, timeout=120,
                env={**os.environ, "CUPY_CACHE_DIR": env_cache})
            last = (out.stdout.strip().splitlines() or [""])[-1]
            err = [ln for ln in out.stderr.splitlines() if "Error" in ln][-1:]
            print(f"{h:>6} {d:9s} {label:40s} {patch:11s} rc={out.returncode} {last} "
                  f"{' '.join(err)}", flush=True)


if __name__ == "__main__":
    main()
