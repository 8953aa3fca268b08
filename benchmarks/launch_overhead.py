"""Host cost of one launch at rows=1: CuPy's Function call against the direct driver path."""

from __future__ import annotations

import time

import cupy

from autonorm.ops import layer_norm as codegen
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.space import default_config
from autonorm.runtime import compiler

problem = Problem(16384, "bfloat16")
kernel = compiler.compile_kernel(codegen.render(default_config(problem), problem))
x = cupy.zeros((1, 16384), dtype=cupy.uint16) + 0x3F80
y = cupy.empty_like(x)
w = cupy.zeros(16384, dtype=cupy.uint16) + 0x3F80
b = cupy.zeros(16384, dtype=cupy.uint16)
stream = cupy.cuda.get_current_stream().ptr
print("driver path:", kernel._driver is not None, "function ptr:",  # noqa: SLF001
      getattr(kernel._function, "ptr", None))  # noqa: SLF001
args = (x.data.ptr, w.data.ptr, b.data.ptr, y.data.ptr, 1, 1e-5, stream)
for label in ("driver", "cupy"):
    if label == "cupy":
        kernel._driver = None  # noqa: SLF001
    for _ in range(200):
        kernel.launch(*args)
    cupy.cuda.Device().synchronize()
    n = 5000
    t0 = time.perf_counter()
    for _ in range(n):
        kernel.launch(*args)
    t1 = time.perf_counter()
    cupy.cuda.Device().synchronize()
    print(f"{label}: {(t1 - t0) / n * 1e6:.2f} us host per launch")
