"""As run for regcap64_ptxas_sweep.txt (2026-11-30, no GPU): every 4th non-bulk bf16 config of the
space at hidden 768-16384, rendered from main's templates with regcap64_lab.patch applied (in
/tmp/capwork/t/templates), compiled by ptxas; spills and registers per kernel to sweep.json.
"""
import json
import sys

sys.path.insert(0, "/work/main/benchmarks/lab")
from spill_sweep import render_from

from autonorm import compiler
from autonorm.space import (
    H200,
    Problem,
    enumerate_space,
    min_blocks_per_sm,
    prefetches,
    register_estimate,
)

out = []
plan = []
for h in (768, 1024, 2048, 4096, 8192, 12288, 16384):
    p = Problem(h, "bfloat16")
    cs = [c for c in enumerate_space(p, H200) if c.cache != "bulk"][::4]
    plan += [(p, c) for c in cs]
print(len(plan), flush=True)
ks = [render_from("/tmp/capwork/t/templates", c, p) for p, c in plan]
for i in range(0, len(ks), 100):
    reps = compiler.compile_offline(ks[i:i+100], "sm_90")
    for (p, c), k in zip(plan[i:i+100], ks[i:i+100], strict=True):
        r = reps[k.name]
        out.append({"hidden": p.hidden, "label": c.label(), "cache": c.cache, "threads": c.threads,
                    "est": register_estimate(c, p), "mb": min_blocks_per_sm(c, p, H200),
                    "prefetch": prefetches(c), "regs": r.registers, "spills": r.spills})
    json.dump(out, open("/tmp/capwork/sweep.json", "w"))
    print(i, sum(o["spills"] for o in out), flush=True)
