"""GPU: the residual add with a float32 residual beside 16-bit x (``residual_dtype``).

The defaults of both norms at decode and prefill row counts and a fixed-seed sample of the
search space verify against float64, h bit for bit (the float32 sum of x and the residual);
kernels with h rounded to x's dtype, with the residual left out, or normalizing x instead of h
must fail the verifier, in the row kernel and in the bulk-copy kernel.
"""

from __future__ import annotations

import random

import pytest
from test_gpu_skew import (  # compiled: the fixture, compiling in a process pool
    assert_break_rejected,
    compiled,  # noqa: F401
    verify_all,
)

from autonorm.ops import registry
from autonorm.ops.layer_norm.space import enumerate_space

pytestmark = pytest.mark.gpu

HIDDEN = (768, 1000, 1001, 4096, 8192, 16384, 65536)
ROWS = (1, 64, 4096)


def _wide(op: str, hidden: int, dtype: str = "bfloat16"):  # noqa: ANN202
    return registry.get(op).problem(hidden=hidden, dtype=dtype, residual=True,
                                    residual_dtype="float32")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_wide_defaults_and_a_sample_verify(compiled, op: str, dtype: str) -> None:  # noqa: F811
    family, limits = registry.get(op), compiled.limits
    work, seen = [], set()
    rng = random.Random(f"wide-{op}-{dtype}")
    for hidden in HIDDEN:
        problem = _wide(op, hidden, dtype)
        configs = [family.default(problem, limits, rows) for rows in ROWS]
        if hidden in (1000, 16384):
            configs += rng.sample(enumerate_space(problem, limits), 6)
        for config in configs:
            rendered = family.render(config, problem, limits)
            if rendered.name not in seen:
                seen.add(rendered.name)
                work.append((problem, rendered))
    assert {r.config.cache for _, r in work} >= {"registers", "smem", "bulk"}
    verify_all(compiled, work)


# (name, the row kernel's text and its break, the bulk kernel's text and its break)
BREAKS = [
    ("h rounded to bf16",
     ("o.v[k] = elem(a, k) + b.v[k];",
      "o.v[k] = __bfloat162float(__float2bfloat16(elem(a, k) + b.v[k]));"),
     ("hv.v[q] = elem(xv, q) + hv.v[q];",
      "hv.v[q] = __bfloat162float(__float2bfloat16(elem(xv, q) + hv.v[q]));")),
    ("residual left out",
     ("o.v[k] = elem(a, k) + b.v[k];", "o.v[k] = elem(a, k);"),
     ("hv.v[q] = elem(xv, q) + hv.v[q];", "hv.v[q] = elem(xv, q);")),
    ("x normalized instead of h",
     ("store_hvec(p, o);\n  return o;",
      "store_hvec(p, o);\n  HVec xo;\n  for (int k = 0; k < V; ++k) xo.v[k] = elem(a, k);\n"
      "  return xo;"),
     ("*reinterpret_cast<HVec*>(hrow + (size_t)j * V) = hv;",
      "{ HVec xo; for (int q = 0; q < V; ++q) xo.v[q] = elem(xv, q); "
      "*reinterpret_cast<HVec*>(hrow + (size_t)j * V) = xo; }")),
]


@pytest.mark.parametrize(("op", "hidden", "rows", "cache"), [
    ("rms_norm", 4096, 64, "smem"),
    ("layer_norm", 4096, 64, "smem"),
    ("rms_norm", 8192, 8192, "bulk"),
    ("layer_norm", 16384, 4096, "bulk"),
])
@pytest.mark.parametrize("index", range(len(BREAKS)), ids=[b[0] for b in BREAKS])
def test_broken_wide_kernels_are_rejected(compiled, op: str, hidden: int, rows: int,  # noqa: F811
                                          cache: str, index: int) -> None:
    family, limits = registry.get(op), compiled.limits
    problem = _wide(op, hidden)
    rendered = family.render(family.default(problem, limits, rows), problem, limits)
    assert rendered.config.cache == cache
    name, row_break, bulk_break = BREAKS[index]
    old, new = bulk_break if cache == "bulk" else row_break
    assert_break_rejected(compiled, problem, rendered, old, new, name)
