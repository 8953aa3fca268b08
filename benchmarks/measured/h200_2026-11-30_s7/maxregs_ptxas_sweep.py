"""As run for maxregs_ptxas_sweep.txt (no GPU): an out-of-sample ptxas check of the max_regs=64
rule (space._max_regs_reasons, before its fp32 clause), from the repo root with PYTHONPATH=$PWD.
"""
import json
import random

from autonorm import codegen, compiler
from autonorm.space import H200, Problem, enumerate_space

rng = random.Random(7)
plan = []
for dtype in ("float16", "float32", "bfloat16"):
    for h in (768, 1000, 2048, 4096, 5000, 8192, 12288, 16384, 32768):
        p = Problem(h, dtype)
        cs = [c for c in enumerate_space(p) if c.max_regs]
        rng.shuffle(cs)
        plan += [(p, c) for c in cs[:60]]
print(len(plan), flush=True)
ks = [codegen.render(c, p, H200) for p, c in plan]
out = []
for i in range(0, len(ks), 120):
    reps = compiler.compile_offline(ks[i:i+120], "sm_90")
    for (p, c), k in zip(plan[i:i+120], ks[i:i+120], strict=True):
        r = reps[k.name]
        out.append({"dtype": p.dtype, "hidden": p.hidden, "label": c.label(),
                    "regs": r.registers, "spills": r.spills})
    json.dump(out, open("/tmp/capwork2/sweep.json", "w"))
    print(i, sum(bool(o["spills"]) for o in out), flush=True)
