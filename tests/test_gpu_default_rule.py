"""GPU: what an untuned shape runs compiles without spills and verifies against float64.

The default's rule and lookup's neighbour step pick kernels no search measured at those shapes
(docs/tuning.md): every pick at a sample of hidden sizes nobody tuned (odd ones among them), in
every dtype, at a few rows and at rows = 2^26 / hidden, with the shipped database and without.
"""

from __future__ import annotations

import pytest

from autonorm.dtypes import DTYPES
from autonorm.ops.layer_norm.problem import Problem

pytestmark = pytest.mark.gpu

HIDDEN = (490, 745, 1000, 1013, 1333, 2047, 3088, 5003, 9488, 20000, 40000, 65537)


@pytest.mark.parametrize("dtype", DTYPES)
def test_untuned_picks_compile_clean_and_verify(dtype: str) -> None:
    from autonorm import lookup
    from autonorm.ops import layer_norm as codegen
    from autonorm.ops.layer_norm.heuristic import default_config
    from autonorm.runtime.device import query_device
    from autonorm.store.db import TuningDB

    info = query_device()
    limits = info.limits()
    device = lookup.Device(info.fingerprint, limits)
    shipped = TuningDB.open_shipped()
    stores = [shipped] if shipped is not None else []
    picks: dict[tuple[Problem, object], str] = {}
    try:
        for hidden in HIDDEN:
            problem = Problem(hidden, dtype)
            for rows in (1, 64, 4096, 2**26 // hidden):
                picks.setdefault((problem, default_config(problem, limits, rows)), "default")
                choice = lookup.choose(problem, rows, device, stores)
                picks.setdefault((problem, choice.config), choice.source)
    finally:
        for store in stores:
            store.close()
    assert_clean_and_verified(
        [(problem, codegen.render(config, problem, limits), source)
         for (problem, config), source in picks.items()])


def assert_clean_and_verified(work: list) -> None:
    """Compile each ``(problem, rendered, source)`` of ``work``; fail naming every kernel that
    spills to local memory or does not verify against float64."""
    from autonorm.ops.layer_norm.verify import verify
    from autonorm.runtime import compiler

    failures = []
    for problem, rendered, source in work:
        kernel = compiler.compile_kernel(rendered)
        local = compiler.local_bytes(kernel)
        result = verify(kernel, problem)
        if local or not result.ok:
            failures.append(f"{problem.describe()} {rendered.config.label()} ({source}): "
                            f"{local} B local, {result.summary()}")
    assert not failures, "\n".join(failures)


# Short skewed 16-bit rows about each bound of bulk_picks.SHORT_TILE_RULES (and past it).
SHORT_SKEWED = (293, 389, 395, 483, 651, 850, 923)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_short_skewed_tiles_verify_in_every_norm_form(dtype: str) -> None:
    # Each norm with and without the residual add, at 2^26 elements: the tile each form takes
    # compiles without spills and verifies against float64.
    from autonorm.ops import registry
    from autonorm.runtime.device import query_device

    limits = query_device().limits()
    work = []
    for op in ("layer_norm", "rms_norm"):
        family = registry.get(op)
        for hidden in SHORT_SKEWED:
            for residual in (False, True):
                problem = family.problem(hidden=hidden, dtype=dtype, residual=residual)
                config = family.default(problem, limits, 2**26 // hidden)
                if config.cache == "bulk":
                    work.append((problem, family.render(config, problem, limits), "default"))
    assert len(work) >= 20
    assert_clean_and_verified(work)
