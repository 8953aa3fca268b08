"""Verify default_config's kernel at the given (dtype, hidden) on the GPU, with the product's
verifier (every case, the outlier-first one included). Used for the long-row fallbacks:

    python benchmarks/lab/verify_defaults.py float32:3145728 float32:4000012 float32:2097151
"""

from __future__ import annotations

import sys
import time

from autonorm import compiler
from autonorm.codegen import render
from autonorm.device import query_device
from autonorm.space import Problem, default_config
from autonorm.verify import verify


def main() -> None:
    limits = query_device().limits()
    for spec in sys.argv[1:]:
        dtype, hidden = spec.split(":")
        problem = Problem(int(hidden), dtype)
        config = default_config(problem, limits)
        t0 = time.time()
        result = verify(compiler.compile_kernel(render(config, problem, limits)), problem)
        worst = max(result.errors.items(), key=lambda kv: kv[1].rel_l2)
        print(f"{dtype} {hidden} {config.label()}: ok={result.ok} {result.summary()}; worst "
              f"rel_l2 {worst[1].rel_l2:.2e} ({worst[0]}) ({time.time() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
