"""Worst relative error per dtype on the verification data, over the shipped winners and the
default configurations of the benchmark grid. Run on the GPU:  python benchmarks/offset_errors.py
"""

from __future__ import annotations

from autonorm.ops import layer_norm as codegen
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.space import default_config
from autonorm.ops.layer_norm.verify import verify
from autonorm.runtime import compiler
from autonorm.runtime.device import query_device
from autonorm.store import db

HIDDEN = (768, 1000, 1024, 2048, 4096, 8192, 12288, 16384, 32768, 65536)


def main() -> None:
    limits = query_device().limits()
    shipped = db.TuningDB.open_shipped()
    winners = shipped.winners() if shipped is not None else []
    configs: list[tuple[Problem, KernelConfig]] = [
        (Problem(w.key.hidden, w.key.dtype), KernelConfig.from_dict(w.config)) for w in winners
    ]
    for dtype in ("float32", "float16", "bfloat16"):
        for hidden in HIDDEN:
            problem = Problem(hidden, dtype)
            configs.append((problem, default_config(problem, limits)))
    worst: dict[str, dict[str, float]] = {}
    failed = []
    for problem, config in configs:
        kernel = compiler.compile_kernel(codegen.render(config, problem, limits))
        result = verify(kernel, problem)
        if not result.ok:
            failed.append(f"{problem} {config.label()}: {result.summary()}")
        for case, err in result.errors.items():
            slot = worst.setdefault(problem.dtype, {})
            slot[case] = max(slot.get(case, 0.0), err.rel_l2)
    print(f"verified {len(configs)} kernels ({len(winners)} shipped winners + defaults); "
          f"failures: {len(failed)}")
    for line in failed:
        print("  FAIL", line)
    for dtype, cases in worst.items():
        print(f"{dtype:9s} worst rel. L2 error: " +
              ", ".join(f"{case} {value:.2e}" for case, value in sorted(cases.items())))


if __name__ == "__main__":
    main()
