"""As run (no GPU, nvcc 13.0, 2026-11-30): ptxas of the capped 16-bit defaults at 168 hidden sizes
(120 distinct kernels): printed "spilling or over 64 registers: []".
"""
import random

from autonorm import codegen, compiler
from autonorm.space import H200, Problem, default_config

rng = random.Random(11)
sizes = sorted({7, 100, 768, 1000, 1536, 2048, 2560, 4096, 5000, 5120, 6144, 8192, 11008, 12289,
                14336, 16384, 24576, 65536} | {rng.randrange(8, 20000) for _ in range(150)})
ks = {}
for d in ("bfloat16", "float16"):
    for h in sizes:
        p = Problem(h, d)
        c = default_config(p)
        if c.max_regs:
            k = codegen.render(c, p, H200)
            ks.setdefault(k.name, k)
ks = list(ks.values())
print(len(ks), "capped default kernels", flush=True)
bad = []
for i in range(0, len(ks), 100):
    reps = compiler.compile_offline(ks[i:i+100], "sm_90")
    for k in ks[i:i+100]:
        r = reps[k.name]
        if r.spills or r.registers > 64:
            bad.append((k.problem.dtype, k.problem.hidden, k.config.label(), r.registers, r.spills))
print("spilling or over 64 registers:", bad)
