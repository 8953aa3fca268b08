"""Lab (session 25, call D): which kernels raise an illegal instruction. Call C's GPU suite hit
cudaErrorIllegalInstruction in the sampled sweep at fp32 16384, and the poisoned context failed
everything after it. Each config (and its plain twin) is verified in a process of its own.

    python benchmarks/lab/keepx_diag.py HIDDEN:DTYPE:LABEL ...     # GPU machine
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys

CHILD = """
import sys
from autonorm import codegen, compiler
from autonorm.space import KernelConfig, Problem
from autonorm.verify import verify
h, d, label = sys.argv[1:4]
p = Problem(int(h), d)
k = compiler.compile_kernel(codegen.render(KernelConfig.from_label(label), p))
r = verify(k, p)
print("ok" if r.ok else "WRONG " + r.summary())
"""


def main() -> None:
    from autonorm.space import KernelConfig

    for spec in sys.argv[1:]:
        h, d, label = spec.split(":")
        cfg = KernelConfig.from_label(label)
        for c in (cfg, dataclasses.replace(cfg, keep_x=not cfg.keep_x)):
            out = subprocess.run([sys.executable, "-c", CHILD, h, d, c.label()],
                                 capture_output=True, text=True, timeout=120)
            last = (out.stdout.strip().splitlines() or [""])[-1]
            err = [ln for ln in out.stderr.splitlines() if "Error" in ln][-1:]
            print(f"{h:>6} {d:9s} {c.label():40s} rc={out.returncode} {last} {' '.join(err)}",
                  flush=True)


if __name__ == "__main__":
    main()
