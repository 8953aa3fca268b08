"""LayerNorm after the fused residual add (``add_layer_norm``), on the CPU.

``h = x + residual`` rounded once to the dtype, then LayerNorm of exactly that ``h``: the problem
(its DB fields leave plain LayerNorm's keys as they were), the family's launch list and sizes,
the kernels' source (h's first element as the shift, h's pads in skewed rows, the bulk kernel's
staged residual), the NumPy path of :func:`autonorm.add_layer_norm` and its argument checks, and
the command line. The GPU tests are in ``test_gpu_add_layer_norm.py``; the verifier's
bit-for-bit check of h is in ``test_rms_family.py``, for both norms.
"""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner
from test_cli_errors import H200 as H200_INFO
from test_cli_errors import invoke
from test_cli_rms import env  # noqa: F401  (the fixture: a tmp DB, a fake H200 and evaluator)

import autonorm
from autonorm import api_add, cli
from autonorm.errors import InputError, ShapeError
from autonorm.ops import registry
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.family import KERNEL_ABI, RESIDUAL_ABI
from autonorm.ops.layer_norm.problem import Problem
from autonorm.runtime.limits import H200
from autonorm.store.db import TuningDB
from autonorm.store.keys import TuningKey

FAMILY = registry.get("layer_norm")
ADD = Problem(4096, "bfloat16", residual=True)


# -- the problem and the family -----------------------------------------------------------------


def test_plain_layer_norm_keys_are_unchanged_and_the_add_keys_its_own():
    assert "residual" not in Problem(4096).fields()
    assert ADD.fields()["residual"] is True
    plain = TuningKey.for_problem("nvidia-h200-0000", Problem(4096), 4096)
    added = TuningKey.for_problem("nvidia-h200-0000", ADD, 4096)
    assert plain != added
    assert FAMILY.problem(**ADD.fields()) == ADD
    assert FAMILY.problem(**Problem(4096).fields()) == Problem(4096)
    assert ADD.describe() == "residual + bfloat16 hidden 4096 (weight, bias)"


def test_the_family_launches_sizes_and_names_the_add():
    kernel = FAMILY.render(FAMILY.default(ADD, H200, 4096), ADD, H200)
    plain = FAMILY.render(FAMILY.default(Problem(4096), H200, 4096), Problem(4096), H200)
    assert FAMILY.kernel_abi(kernel) == RESIDUAL_ABI
    assert FAMILY.kernel_abi(plain) == KERNEL_ABI
    # x, residual read and y, h written once; weight and bias read once
    assert FAMILY.bytes_moved(ADD, 10) == (4 * 10 + 2) * 4096 * 2
    assert FAMILY.export_basename(ADD) == "autonorm_add_ln_bf16_h4096"
    assert FAMILY.neighbour_distance(ADD, Problem(4096)) is None
    assert FAMILY.neighbour_distance(ADD, Problem(5120, residual=True)) is not None


def test_the_shift_is_hs_first_element_in_the_row_kernel():
    config = KernelConfig(256, 8, 1, "registers", "two_pass", 1, 0)
    source = FAMILY.render(config, ADD, H200).source
    shift = "const float shift = to_f(from_f(to_f(x[row_base]) + to_f(__ldcg(res + row_base))));"
    assert shift in source
    assert "const float shift = to_f(x[row_base]);" not in source
    assert "const T* __restrict__ res," in source.replace("__nv_bfloat16", "T")


def test_a_skewed_row_pads_h_with_hs_first_element():
    problem = Problem(4099, "bfloat16", residual=True)
    config = KernelConfig(256, 8, 1, "registers", "two_pass", 1, 0)
    source = FAMILY.render(config, problem, H200).source
    assert "const T pad = from_f(to_f(x[row_base]) + to_f(__ldcg(res + row_base)));" in source
    assert "pad_out(keep_sum(hr + (size_t)j * V, j * V - h," in source


def test_the_bulk_kernel_stages_the_residual_beside_x():
    problem = Problem(16384, "bfloat16", residual=True)
    config = KernelConfig(256, 8, 1, "bulk", "two_pass", 1, 0, stages=2)
    assert FAMILY.check(config, problem, H200) == []
    plain = KernelConfig(256, 8, 1, "bulk", "two_pass", 1, 0, stages=2)
    from autonorm.ops.layer_norm.plan import derive_plan

    added_plan = derive_plan(config, problem, H200)
    plain_plan = derive_plan(plain, Problem(16384), H200)
    assert added_plan.stage_bytes == 2 * plain_plan.stage_bytes
    assert added_plan.smem_bytes == plain_plan.smem_bytes + plain_plan.stage_bytes
    source = FAMILY.render(config, problem, H200).source
    assert "T* rstages = stages + (size_t)S * R * SEG;" in source
    assert "(unsigned)nr * ROW_BYTES * 2u" in source  # both tiles counted on the stage's barrier
    assert "const float shift = hshift;" in source
    assert "o[q] = elem(xv, q) + elem(rv, q);" in source


def test_the_default_serves_the_add_at_every_regime():
    for hidden in (768, 4096, 4099, 16384, 65536):
        for rows in (1, 64, 8192):
            for dtype in ("float32", "bfloat16"):
                problem = Problem(hidden, dtype, residual=True)
                config = FAMILY.default(problem, H200, rows)
                assert FAMILY.check(config, problem, H200) == [], (problem, rows, config)
                assert config.cache != "none"


def test_a_fused_row_no_cache_can_hold_is_refused_in_one_line_that_says_why():
    import dataclasses

    from autonorm.errors import ConfigError

    a100 = dataclasses.replace(H200, name="NVIDIA A100", cc=80, sm_count=108,
                               max_smem_optin=166912)
    plain = Problem(65536, "float32")
    assert FAMILY.check(FAMILY.default(plain, a100, 1024), plain, a100) == []
    with pytest.raises(ConfigError) as info:
        FAMILY.default(Problem(65536, "float32", residual=True), a100, 1024)
    message = str(info.value)
    assert "\n" not in message
    assert "with the residual add on NVIDIA A100" in message
    assert "262,144 bytes" in message and "no thread-block clusters" in message


# -- the NumPy path ------------------------------------------------------------------------------


def _layer_norm64(h: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    h64 = h.astype(np.float64)
    mean = h64.mean(axis=-1, keepdims=True)
    var = ((h64 - mean) ** 2).mean(axis=-1, keepdims=True)
    return (h64 - mean) / np.sqrt(var + eps) * w.astype(np.float64) + b.astype(np.float64)


def test_add_layer_norm_is_in_the_public_api():
    assert "add_layer_norm" in autonorm.__all__
    assert autonorm.add_layer_norm is api_add.add_layer_norm


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_numpy_sum_is_exact_and_the_norm_matches_float64(dtype: str):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((5, 257)) * 8).astype(dtype)
    r = (rng.standard_normal((5, 257)) * 3).astype(dtype)
    w = (1 + 0.1 * rng.standard_normal(257)).astype(dtype)
    b = (0.1 * rng.standard_normal(257)).astype(dtype)
    y, h = autonorm.add_layer_norm(x, r, w, b, 1e-5)
    assert h.dtype == x.dtype and np.array_equal(h, x + r)  # NumPy's own rounded sum
    err = np.abs(y.astype(np.float64) - _layer_norm64(h, w, b, 1e-5)).max()
    assert err <= (1e-6 if dtype == "float32" else 4e-3), err
    xi, ri = x.copy(), r.copy()
    out = autonorm.add_layer_norm(xi, ri, w, b, 1e-5, in_place=True)
    assert out[0] is xi and out[1] is ri
    assert np.array_equal(xi, y) and np.array_equal(ri, h)


def test_bad_arguments_are_one_line_errors_that_name_them():
    x = np.ones((2, 16), np.float32)
    with pytest.raises(ShapeError, match="residual") as info:
        autonorm.add_layer_norm(x, np.ones((2, 8), np.float32))
    assert "\n" not in str(info.value)
    with pytest.raises(InputError, match="bias"):
        autonorm.add_layer_norm(x, x.copy(), np.ones(16, np.float32), np.ones(8, np.float32))
    with pytest.raises(InputError, match="in_place"):
        autonorm.add_layer_norm(x, x.copy(), in_place="yes")
    with pytest.raises(InputError, match="shares memory"):
        autonorm.add_layer_norm(x, x, in_place=True)
    with pytest.raises(InputError, match="x must be a CuPy array, a torch tensor or a NumPy array"):
        autonorm.add_layer_norm([1.0, 2.0], [1.0, 2.0])


# -- the command line ---------------------------------------------------------------------------


def test_render_prints_layer_norms_residual_kernel():
    result = CliRunner().invoke(cli.main, ["render", "--hidden", "4096", "--residual"])
    assert result.exit_code == 0, result.output
    assert "problem: hidden=4096 dtype=bfloat16 weight=True bias=True residual=True" in (
        result.stdout)
    assert "hout" in result.stdout
    plain = CliRunner().invoke(cli.main, ["render", "--hidden", "4096"])
    assert "residual" not in plain.stdout.split("\n", 3)[1] and "hout" not in plain.stdout


# -- export ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("config", [KernelConfig(256, 8, 1, "registers", "two_pass", 1, 0),
                                    KernelConfig(512, 8, 1, "bulk", "two_pass", 1, 0, stages=1)],
                         ids=["row", "bulk"])
def test_an_export_declares_the_fused_add_and_passes_the_kernel_its_order(config):
    from test_export_rms import _call_args, _declared

    from autonorm.export import render_export

    problem = Problem(16384, "bfloat16", residual=True)
    exported = render_export(config, problem)
    name = "autonorm_add_ln_bf16_h16384"
    assert exported.header.startswith(f"// {name}.h: residual add + LayerNorm forward exported")
    assert "#define AUTONORM_ADD_LN_BF16_H16384_RESIDUAL 1" in exported.header
    assert "y[r, :] = (h[r, :] - mean(h[r, :])) / sqrt(var(h[r, :]) + eps) * weight + bias" in (
        exported.header)
    assert f"{name}_forward(x, residual, weight, bias, x, residual, rows, eps, stream);" in (
        exported.header)
    params = [n for _, n in _declared(exported.header, f"{name}_forward")]
    assert params == ["x", "residual", "weight", "bias", "y", "h", "rows", "eps", "stream"]
    assert [p["name"] for p in exported.manifest["parameters"]] == params
    assert _call_args(exported.source, exported.kernel.name)[:8] == [
        "x", "residual", "weight", "bias", "y", "h", "rows", "eps"]


def test_an_exported_fused_layer_norm_compiles_with_plain_nvcc(tmp_path):
    from test_export_rms import _nvcc, _run

    from autonorm.export import export_kernel

    nvcc = _nvcc()
    problem = Problem(16384, "bfloat16", residual=True)
    paths = export_kernel(FAMILY.default(problem, H200, 4096), problem, tmp_path)
    assert paths[0].name == "autonorm_add_ln_bf16_h16384.cu"
    proc = _run([nvcc, "-arch=sm_90", "-std=c++17", "-Xcompiler", "-Wall,-Wextra", "-c",
                 paths[0].name, "-o", "exported.o"], tmp_path)
    assert "warning" not in (proc.stdout + proc.stderr).lower(), proc.stderr


def test_tune_stores_the_fused_layer_norm_apart_from_the_plain_one(env, tmp_path):  # noqa: F811
    status, out, err = invoke(["tune", "--residual", "--hidden", "8192", "--rows", "1024",
                               "--trials", "3"])
    assert status == 0, err
    assert "tuning layer_norm residual + bfloat16 hidden 8192 (weight, bias), rows=1024" in err
    added = Problem(8192, residual=True)
    assert env == [added]
    with TuningDB(tmp_path / "user.db") as store:
        winner = store.get_winner(TuningKey.for_problem(H200_INFO.fingerprint, added, 1024))
        plain = store.get_winner(TuningKey.for_problem(H200_INFO.fingerprint, Problem(8192),
                                                       1024))
    assert plain is None
    assert winner is not None and winner.key.fields["residual"] is True
    assert f"winner: {FAMILY.config_from_dict(winner.config).label()}" in out
