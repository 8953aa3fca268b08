"""The RMSNorm family on the CPU: its problem, reference, rules and rendering (no GPU).

RMSNorm runs LayerNorm's row and bulk-copy kernels with the mean-of-squares statistic; these
tests check what it changes there and that LayerNorm's kernels do not change with it.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from autonorm.ops import registry
from autonorm.ops.base import problem_key
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.problem import Problem as LNProblem
from autonorm.ops.rms_norm.problem import Problem
from autonorm.ops.rms_norm.reference import rms_norm_cpu, rms_norm_reference
from autonorm.runtime.limits import H200

FAMILY = registry.get("rms_norm")


def test_the_registry_serves_rms_norm():
    assert "rms_norm" in registry.known()
    assert FAMILY.op == "rms_norm"
    assert registry.family_of(Problem(4096)) is FAMILY
    assert registry.family_of(LNProblem(4096)).op == "layer_norm"


def test_the_problem_names_its_fields_and_refuses_an_offset_without_weight():
    p = Problem(4096, "bf16", weight_offset=True)
    assert p.fields() == {"hidden": 4096, "dtype": "bfloat16", "has_weight": True,
                          "weight_offset": True, "residual": False}
    assert not p.has_bias and p.norm == "rms"
    assert "1 + weight" in p.describe()
    assert FAMILY.problem(**p.fields()) == p
    assert problem_key(p) != problem_key(Problem(4096, "bf16"))
    with pytest.raises(ValueError, match="weight_offset"):
        Problem(4096, weight_offset=True, has_weight=False)
    with pytest.raises(TypeError):
        FAMILY.problem(hidden=4096, has_bias=False)  # RMSNorm has no bias field


def test_the_reference_is_x_over_its_root_mean_square():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 37))
    w = rng.standard_normal(37)
    rms = np.sqrt((x**2).sum(axis=1, keepdims=True) / 37 + 1e-6)
    np.testing.assert_allclose(rms_norm_reference(x, None, 1e-6), x / rms, rtol=1e-14)
    np.testing.assert_allclose(rms_norm_reference(x, w, 1e-6), x / rms * w, rtol=1e-14)
    np.testing.assert_allclose(rms_norm_reference(x, w, 1e-6, True), x / rms * (1 + w),
                               rtol=1e-14)
    out = rms_norm_cpu(x.astype(np.float32), w.astype(np.float32), 1e-6)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, x / rms * w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        Problem(37, "float32", weight_offset=True).reference(x, w, None, 1e-6),
        x / rms * (1 + w), rtol=1e-14)
    with pytest.raises(ValueError, match="no bias"):
        Problem(37).reference(x, w, w, 1e-6)


def test_rms_norm_has_one_statistic_and_no_row_cache_rule():
    p = Problem(4096, "float32")
    welford = KernelConfig(256, 4, 1, "registers", "welford", 1, 0)
    assert any("one statistic" in r for r in FAMILY.check(welford, p, H200))
    # Two reads of the row, not three: RMSNorm may go uncached where LayerNorm's two-pass may not.
    none = KernelConfig(256, 4, 1, "none", "two_pass", 1, 0)
    assert FAMILY.check(none, p, H200) == []
    assert registry.get("layer_norm").check(none, LNProblem(4096, "float32"), H200)
    space = FAMILY.space(p, H200)
    assert space and {c.stats for c in space} == {"two_pass"}
    assert {"none", "registers", "smem", "bulk"} <= {c.cache for c in space}


@pytest.mark.parametrize("woff", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_rms_kernels_take_no_mean_and_scale_by_the_weight(dtype: str, woff: bool):
    rng = random.Random(f"rms-{dtype}-{woff}")
    for hidden in (7, 1000, 4096, 4099, 65536):
        problem = Problem(hidden, dtype, weight_offset=woff)
        space = FAMILY.space(problem, H200)
        for cfg in [FAMILY.default(problem, H200, 4096), *rng.sample(space, min(12, len(space)))]:
            k = FAMILY.render(cfg, problem, H200)
            assert k.name.startswith("autonorm_rms_"), k.name
            assert "// autonorm RMSNorm forward" in k.source
            # No mean, no shift: the statistic is the mean of squares of x itself.
            assert "const float shift" not in k.source, cfg.label()
            assert "const float var = s2 * INV_N" in k.source or "m2_acc * INV_N" in k.source
            assert ("(1.f + elem(wv" in k.source) is woff, cfg.label()


def test_layer_norm_and_rms_kernels_of_one_config_differ_in_name_and_code():
    cfg = KernelConfig(256, 8, 1, "registers", "two_pass", 1, 0)
    ln = registry.get("layer_norm").render(cfg, LNProblem(4096, "bf16", True, False), H200)
    rms = FAMILY.render(cfg, Problem(4096, "bf16"), H200)
    assert ln.name.startswith("autonorm_ln_") and rms.name.startswith("autonorm_rms_")
    assert ln.source != rms.source
    assert "const float shift" in ln.source


def test_neighbours_lend_only_within_the_same_weight_form():
    p = Problem(3000, "bf16")
    assert FAMILY.neighbour_distance(p, Problem(4096, "bf16")) == pytest.approx(
        np.log2(4096 / 3000))
    assert FAMILY.neighbour_distance(p, Problem(4096, "bf16", weight_offset=True)) is None
    assert FAMILY.neighbour_distance(p, Problem(4096, "fp16")) is None
    assert FAMILY.neighbour_distance(p, Problem(4096, "bf16", residual=True)) is None
    assert FAMILY.neighbour_distance(Problem(3000, "bf16", residual=True),
                                     Problem(4096, "bf16", residual=True)) is not None
    assert FAMILY.neighbour_distance(p, Problem(8192, "bf16")) is None
    assert FAMILY.neighbour_distance(p, Problem(3001, "bf16")) is None  # off the vector grid
    assert FAMILY.neighbour_distance(Problem(3001, "bf16"), Problem(4097, "bf16")) is not None


def test_bytes_moved_count_x_y_and_the_weight_once():
    assert FAMILY.bytes_moved(Problem(4096, "bf16"), 10) == (20 + 1) * 4096 * 2
    assert FAMILY.bytes_moved(Problem(4096, "float32", has_weight=False), 10) == 20 * 4096 * 4


def test_export_basenames_name_the_weight_form():
    assert FAMILY.export_basename(Problem(4096, "bf16")) == "autonorm_rms_bf16_h4096"
    assert FAMILY.export_basename(Problem(4096, "bf16", weight_offset=True)).endswith("_offset")
    assert FAMILY.export_basename(Problem(4096, "fp32", has_weight=False)).endswith("_noweight")


# ---------------------------------------------------------------- the residual add


def test_residual_kernels_take_the_residual_and_h_and_keep_the_sum():
    p = Problem(4099, "bf16", residual=True)
    assert p.fields()["residual"] and p.describe().startswith("residual + ")
    cfg = FAMILY.default(p, H200, 4096)
    assert FAMILY.check(cfg, p, H200) == []
    k = FAMILY.render(cfg, p, H200)
    assert "const __nv_bfloat16* __restrict__ res," in k.source
    assert "__nv_bfloat16* __restrict__ hout," in k.source
    assert "keep_sum(hr + (size_t)j * V, j * V - h," in k.source  # skewed: predicated h stores
    assert FAMILY.kernel_abi(k).params == "QQQQQQif" and FAMILY.kernel_abi(k).rows_index == 6
    plain = FAMILY.render(cfg, Problem(4099, "bf16"), H200)
    assert FAMILY.kernel_abi(plain).params == "QQQQif" and "keep_sum" not in plain.source
    assert FAMILY.bytes_moved(p, 10) == (40 + 1) * 4099 * 2
    assert FAMILY.export_basename(p) == "autonorm_add_rms_bf16_h4099"


def test_the_residual_add_needs_a_row_cache():
    p = Problem(16384, "float32", residual=True)
    reasons = {
        cache: FAMILY.check(KernelConfig(512 if cache == "bulk" else 256, 4, 1, cache,
                                         "two_pass", 1, 0, stages=1 if cache == "bulk" else 0),
                            p, H200)
        for cache in ("none", "bulk", "smem")
    }
    assert any("residual" in r for r in reasons["none"])
    assert reasons["bulk"] == [] and reasons["smem"] == []
    prefetch = KernelConfig(256, 4, 1, "registers", "two_pass", 1, 2)
    assert any("prefetch" in r
               for r in FAMILY.check(prefetch, Problem(4096, "float32", residual=True), H200))
    assert FAMILY.check(prefetch, Problem(4096, "float32"), H200) == []
    for hidden in (768, 4096, 65536):
        for rows in (1, 64, 8192):
            q = Problem(hidden, "bf16", residual=True)
            assert FAMILY.check(FAMILY.default(q, H200, rows), q, H200) == []


class _NumpyResidualKernel:
    """A residual norm (the problem's) in NumPy, as a kernel launches it; ``break_h`` stores a
    wrong h."""

    plan = type("P", (), {"cluster": 1})()

    def __init__(self, problem: Problem, break_h: bool = False) -> None:
        self.problem, self.break_h = problem, break_h

    def launch_arrays(self, x, r, w, b, y, h, rows, eps, grid=None):  # noqa: ANN001
        from autonorm.numerics import from_float64, to_float64

        d = self.problem.dtype
        h64 = to_float64(from_float64(to_float64(x, d) + to_float64(r, d), d), d)
        if self.break_h:
            h64 = h64 + 1.0
        h[:rows] = from_float64(h64, d).view(h.dtype)
        w64 = None if w is None else to_float64(w, d)
        b64 = None if b is None else to_float64(b, d)
        out = self.problem.reference(to_float64(h[:rows].view(x.dtype), d) if d != "bfloat16"
                                     else to_float64(h[:rows], d), w64, b64, eps)
        y[:rows] = from_float64(out, d).view(y.dtype)


@pytest.mark.parametrize("norm", [Problem, LNProblem], ids=["rms", "layer"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_verifier_checks_the_residual_sum_bit_for_bit(norm: type, dtype: str):
    from autonorm.ops.layer_norm.verify import verify

    problem = norm(64, dtype, residual=True)
    good = verify(_NumpyResidualKernel(problem), problem, xp=np)
    assert good.ok, good.summary()
    bad = verify(_NumpyResidualKernel(problem, break_h=True), problem, xp=np)
    assert not bad.ok and "h differs" in bad.summary()
