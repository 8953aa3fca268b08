"""GPU: the backward kernels verify against float64 gradients, repeat bit for bit, and break.

A fixed-seed cover of the template's branches (row in registers, read again or staged by bulk
copy, whole or split over a cluster, read from the stage in every pass or held in registers;
column sums in registers, shared memory or L2; groups of blocks taking rows side by side in
one cluster; several grids) is verified for LayerNorm and RMSNorm in every dtype, fp32 dx and
dweight within 1e-5 of float64 on rows of mean 1000 and spread 0.1 (and on such rows whose
first element, LayerNorm's shift, lies far from the rest). Broken kernels (dx without its mean
term, the shift and the second pass's mean correction dropped, dweight summed over half the
partial rows, a stage refilled with the wrong row, a group's sums left out, LayerNorm's one-pass
statistics kept on rows whose shift lies far from the mean) must fail the verifier, a kernel
without its shift still verifies, and the public functions give torch's gradients.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
from backward_breaks import BROKEN_CONFIGS, NO_SHIFT, PLANTED, plant

from autonorm.ops import registry
from autonorm.ops.norm_backward.few_rows import FEW_ROWS, GROUP_ROWS, REREAD_ROWS
from autonorm.ops.norm_backward.verify import verify

pytestmark = pytest.mark.gpu

OPS = ("layer_norm_backward", "rms_norm_backward")
HIDDEN = (1, 100, 768, 1000, 4096, 8192, 16384, 65536)
PICKS = 1  # configurations verified per op, dtype and hidden size beyond the default


@pytest.fixture(scope="module")
def limits():  # noqa: ANN201
    from autonorm.runtime.device import query_device

    return query_device(0).limits()


@pytest.fixture(scope="module")
def pool():  # noqa: ANN201
    from autonorm.runtime.compiler import CompilePool

    compile_pool = CompilePool()
    yield compile_pool
    compile_pool.close()


def _compile(kernel):  # noqa: ANN001, ANN202
    from autonorm.runtime.compiler import compile_kernel

    return compile_kernel(kernel)


def _cover(family, problem, limits, rng: random.Random) -> list:  # noqa: ANN001
    """The default (at any rows, at one row, at few rows, at the groups' and at the rereading
    buckets), and one pick of the space, of its whole-row bulk kernels, its clusters, its bulk
    kernels holding the row in registers and its groups."""
    space = family.space(problem, limits)
    bulk = [c for c in space if c.cache == "bulk" and c.cluster == 1]
    clustered = [c for c in space if c.cluster > 1]
    picks = [family.default(problem, limits, rows)
             for rows in (None, 1, FEW_ROWS, 2, 4, GROUP_ROWS, REREAD_ROWS)]
    picks += rng.sample(space, min(PICKS, len(space)))
    picks += rng.sample(bulk, min(PICKS, len(bulk)))
    picks += rng.sample(clustered, min(PICKS, len(clustered)))
    held = [c for c in space if c.hold]
    picks += rng.sample(held, min(PICKS, len(held)))
    grouped = [c for c in space if c.groups > 1]
    picks += rng.sample(grouped, min(PICKS, len(grouped)))
    laned = [c for c in space if c.lanes]
    picks += rng.sample(laned, min(PICKS, len(laned)))
    return list(dict.fromkeys(picks))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_cover_verifies(op: str, dtype: str, limits, pool) -> None:  # noqa: ANN001
    from autonorm.runtime.device import query_device

    family = registry.get(op)
    rng = random.Random(f"{op}{dtype}")
    # Every kernel of the cover is compiled in the pool's processes first (NVRTC one at a time
    # here took most of this test's minutes); compile_kernel then loads each from the cache.
    rendered = []
    for hidden in HIDDEN:
        problem = family.problem(hidden=hidden, dtype=dtype)
        rendered += [(problem, family.render(c, problem, limits))
                     for c in _cover(family, problem, limits, rng)]
    arch = query_device(0).arch
    for _, kernel in rendered:
        pool.submit(kernel, arch)
    failures = []
    for problem, source in rendered:
        assert pool.wait(source) is None, source.config.label()
        # A kernel that spills is verified too: the evaluator times it like any other.
        result = verify(_compile(source), problem)
        if not result.ok:
            failures.append(f"{problem.hidden} {source.config.label()}: {result.summary()}")
    assert not failures, failures


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_residual_backward_verifies_and_breaks(op: str, dtype: str, limits) -> None:  # noqa: ANN001
    # After a residual add the returned h's gradient joins dx; a kernel that drops it fails.
    family = registry.get(op)
    rng = random.Random(f"residual{op}{dtype}")
    for hidden in (4096, 65536):
        problem = family.problem(hidden=hidden, dtype=dtype, residual=True)
        for config in _cover(family, problem, limits, rng):
            kernel = family.render(config, problem, limits)
            result = verify(_compile(kernel), problem)
            assert result.ok, (config.label(), result.summary())
    old = "o[k] += elem(ha, k);"
    assert old in kernel.source
    broken = dataclasses.replace(kernel, source=kernel.source.replace(old, ";"))
    assert not verify(_compile(broken), problem).ok


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("hidden", [1024, 4096, 16384])
def test_fp32_offset_rows_within_1e5(op: str, hidden: int, limits) -> None:  # noqa: ANN001
    family = registry.get(op)
    problem = family.problem(hidden=hidden, dtype="float32")
    result = verify(_compile(family.render(family.default(problem, limits), problem, limits)),
                    problem)
    assert result.ok, result.summary()
    for case in ("offset", "offset-far-shift"):
        for name in (f"{case}/dx", f"{case}/dweight"):
            assert result.errors[name].rel_l2 <= 1e-5, (name, result.errors[name])
    # The second pass corrects its mean's rounding: without it, rows whose shift lies 100
    # spreads off their mean were off by 5.5e-5 (4096) and 7.3e-5 (16384) of the terms at an
    # element (H200).
    assert result.errors["offset-far-shift/dx"].scaled_max <= 1e-5


@pytest.mark.parametrize(("form", "name"), PLANTED)
def test_broken_kernels_are_rejected(form: str, name: str, limits) -> None:  # noqa: ANN001
    family = registry.get("layer_norm_backward")
    problem = family.problem(hidden=4096, dtype="float32")
    kernel = family.render(family.config_from_dict(BROKEN_CONFIGS[form]), problem, limits)
    source = plant(kernel.source, name)
    result = verify(_compile(dataclasses.replace(kernel, source=source)), problem)
    assert not result.ok, f"{name} passed verification"


def test_a_kernel_without_its_shift_still_verifies(limits) -> None:  # noqa: ANN001
    # Its offset rows (mean 1000) all take the corrected second pass, which keeps them exact.
    family = registry.get("layer_norm_backward")
    problem = family.problem(hidden=4096, dtype="float32")
    kernel = family.render(family.config_from_dict(BROKEN_CONFIGS["held"]), problem, limits)
    old, new = NO_SHIFT
    assert old in kernel.source
    result = verify(_compile(dataclasses.replace(kernel, source=kernel.source.replace(old, new))),
                    problem)
    assert result.ok, result.summary()
    for name in ("offset/dx", "offset/dweight", "offset-far-shift/dx"):
        assert result.errors[name].rel_l2 <= 1e-5, (name, result.errors[name])


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_public_functions_match_torch(op: str) -> None:
    cupy = pytest.importorskip("cupy")
    torch = pytest.importorskip("torch")
    import autonorm

    rows, hidden = 3000, 4096
    x = torch.randn(rows, hidden, device="cuda", dtype=torch.float64)
    dy = torch.randn_like(x)
    w = 1 + 0.1 * torch.randn(hidden, device="cuda", dtype=torch.float64)
    b = 0.1 * torch.randn(hidden, device="cuda", dtype=torch.float64)
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    if op == "layer_norm":
        torch.nn.functional.layer_norm(leaves[0], (hidden,), leaves[1], leaves[2], 1e-5
                                       ).backward(dy)
        ours = autonorm.layer_norm_backward(
            *(cupy.from_dlpack(t.float()) for t in (dy, x, w, b)), eps=1e-5)
    else:
        leaves = leaves[:2]
        torch.nn.functional.rms_norm(leaves[0], (hidden,), leaves[1], 1e-6).backward(dy)
        ours = autonorm.rms_norm_backward(*(cupy.from_dlpack(t.float()) for t in (dy, x, w)))
    assert len(ours) == len(leaves)
    for got, leaf in zip(ours, leaves, strict=True):
        ref = leaf.grad.cpu().numpy()
        err = np.abs(cupy.asnumpy(got).astype(np.float64) - ref).max() / np.abs(ref).max()
        assert err < 1e-5, (op, err)


def test_repeated_launches_are_bit_identical(limits) -> None:  # noqa: ANN001
    cupy = pytest.importorskip("cupy")
    import autonorm

    rng = cupy.random.default_rng(0)
    x = rng.standard_normal((8192, 8192), dtype=cupy.float32)
    dy = rng.standard_normal((8192, 8192), dtype=cupy.float32)
    w = rng.standard_normal(8192, dtype=cupy.float32)
    first = autonorm.layer_norm_backward(dy, x, w, w)
    for _ in range(3):
        again = autonorm.layer_norm_backward(dy, x, w, w)
        for a, b in zip(first, again, strict=True):
            assert bool((a.view(cupy.uint32) == b.view(cupy.uint32)).all())


def test_static_and_dynamic_shared_memory_past_48kb_launch(limits) -> None:  # noqa: ANN001
    # 40,976 bytes of dynamic shared memory beside 8,960 static: under 48 KB alone, over it
    # together, where the launch fails unless the kernel's cap is raised.
    family = registry.get("rms_norm_backward")
    problem = family.problem(hidden=2048, dtype="float32")
    config = family.config_from_dict({"threads": 512, "vec": 4, "cache": "bulk", "acc": "smem",
                                      "blocks_per_sm": 1, "stages": 2})
    kernel = _compile(family.render(config, problem, limits))
    assert kernel.rendered.launch.smem_bytes < 48 * 1024
    assert kernel.rendered.launch.smem_bytes + kernel.attributes["shared_size_bytes"] > 48 * 1024
    result = verify(kernel, problem)
    assert result.ok, result.summary()
