"""A float32 residual beside 16-bit x (``residual_dtype``): the problem, its rules, its kernels'
code and launch plans, its exports and the command line. No GPU: the GPU runs are in
tests/test_gpu_wide_residual.py.

The residual is read and h stored as float32, and the row is normalized from that float32 h.
Every other problem renders what it rendered before the field existed (its kernel names and
digests, which shipped winners are keyed by, are checked by tests/test_shipped_kernels.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_cli_errors import assert_one_error_line, invoke
from test_compile_offline import ptx_of

from autonorm.export import export_kernel
from autonorm.ops import registry
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.plan import derive_plan
from autonorm.ops.layer_norm.problem import Problem as LayerNormProblem
from autonorm.ops.layer_norm.rules import check
from autonorm.ops.layer_norm.shape import SCRATCH_SMEM
from autonorm.ops.rms_norm.problem import Problem as RMSProblem
from autonorm.runtime import offline
from autonorm.runtime.limits import H200

WIDE_RMS = RMSProblem(4096, "bfloat16", residual=True, residual_dtype="float32")
WIDE_LN = LayerNormProblem(4096, "float16", residual=True, residual_dtype="fp32")


def _problem_line(source: str) -> str:
    """The kernel's ``// problem: ...`` comment line."""
    return next(line for line in source.splitlines() if line.startswith("// problem:"))


def test_residual_dtype_is_normalized_and_checked() -> None:
    assert WIDE_LN.residual_dtype == "float32"
    assert WIDE_LN.h_dtype == "float32" and WIDE_LN.h_itemsize == 4 and WIDE_LN.wide_residual
    # x's own dtype is the plain residual add
    same = RMSProblem(4096, "bfloat16", residual=True, residual_dtype="bf16")
    assert same == RMSProblem(4096, "bfloat16", residual=True) and not same.wide_residual
    assert LayerNormProblem(64, "float32", residual=True, residual_dtype="float32") == (
        LayerNormProblem(64, "float32", residual=True))
    with pytest.raises(ValueError, match="needs residual=True"):
        RMSProblem(4096, "bfloat16", residual_dtype="float32")
    with pytest.raises(ValueError, match="must be float32"):
        RMSProblem(4096, "bfloat16", residual=True, residual_dtype="float16")


def test_only_a_wide_problem_names_its_residual_dtype() -> None:
    assert "residual_dtype" not in RMSProblem(4096, residual=True).fields()
    assert "residual_dtype" not in repr(RMSProblem(4096, residual=True))
    assert WIDE_RMS.fields()["residual_dtype"] == "float32"
    assert "residual_dtype='float32'" in repr(WIDE_RMS)
    assert WIDE_LN.describe().startswith("float32 residual + float16")
    # Kernel names hash the problem: the wide kernel is another kernel.
    config = registry.get("rms_norm").default(WIDE_RMS, H200, 64)
    fam = registry.get("rms_norm")
    plain = RMSProblem(4096, "bfloat16", residual=True)
    assert fam.render(config, WIDE_RMS, H200).name != fam.render(config, plain, H200).name


def test_bytes_count_the_residual_and_h_as_float32() -> None:
    fam = registry.get("layer_norm")
    rows, n = 128, 4096
    # x and y 2 bytes, residual and h 4, weight and bias once
    assert fam.bytes_moved(WIDE_LN, rows) == rows * n * (2 + 2 + 4 + 4) + 2 * n * 2
    plain = LayerNormProblem(n, "float16", residual=True)
    assert fam.bytes_moved(plain, rows) == (4 * rows + 2) * n * 2


@pytest.mark.parametrize("hidden", [768, 1000, 1001, 4099, 8192, 16384, 65536])
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_every_default_runs_whole_vectors(op: str, hidden: int) -> None:
    fam = registry.get(op)
    problem = fam.problem(hidden=hidden, dtype="bfloat16", residual=True,
                          residual_dtype="float32")
    for rows in (1, 8, 64, 512, 4096, (1 << 26) // hidden):
        config = fam.default(problem, H200, rows)
        assert not check(config, problem, H200), (rows, config.label())
        assert hidden % config.vec == 0, (rows, config.label())


def test_skewed_rows_are_refused() -> None:
    problem = RMSProblem(1001, "bfloat16", residual=True, residual_dtype="float32")
    reasons = check(KernelConfig(128, 8, 1, "registers", "two_pass", 1, 0), problem, H200)
    assert any("float32 residual takes rows on the vector grid" in r for r in reasons), reasons
    # the same configuration with the plain add runs skewed
    plain = RMSProblem(1001, "bfloat16", residual=True)
    assert not check(KernelConfig(128, 8, 1, "registers", "two_pass", 1, 0), plain, H200)


def test_the_row_cache_and_the_stages_hold_float32() -> None:
    smem = KernelConfig(128, 8, 1, "smem", "two_pass", 1, 0)
    plan = derive_plan(smem, WIDE_RMS, H200)
    assert plan.smem_bytes == 4096 * 4 + SCRATCH_SMEM
    assert not plan.fp32_row  # the cache is float32 already
    registers = derive_plan(KernelConfig(512, 8, 1, "registers", "two_pass", 1, 0), WIDE_RMS,
                            H200)
    plain = derive_plan(KernelConfig(512, 8, 1, "registers", "two_pass", 1, 0),
                        RMSProblem(4096, "bfloat16", residual=True), H200)
    assert registers.shape.cache_regs == 2 * plain.shape.cache_regs
    bulk = KernelConfig(256, 8, 1, "bulk", "two_pass", 1, 0, stages=2)
    wide, same = derive_plan(bulk, WIDE_RMS, H200), derive_plan(
        bulk, RMSProblem(4096, "bfloat16", residual=True), H200)
    # x's stages, then the residual's at twice their bytes
    assert wide.stage_bytes == 2 * 4096 * (2 + 4)  # 2 stages of one row
    assert same.stage_bytes == 2 * 4096 * (2 + 2)
    assert not wide.fp32_tile


@pytest.mark.parametrize("config", [
    KernelConfig(128, 8, 1, "smem", "two_pass", 1, 0),
    KernelConfig(512, 8, 1, "registers", "welford", 1, 0),
    KernelConfig(256, 8, 1, "bulk", "two_pass", 1, 0, stages=2),
    KernelConfig(128, 8, 1, "bulk", "two_pass", 4, 0, stages=1),
], ids=["smem", "registers", "bulk", "bulk-cluster"])
def test_the_kernel_reads_and_writes_float32_residual_rows(config: KernelConfig) -> None:
    fam = registry.get("layer_norm")
    source = fam.render(config, WIDE_LN, H200).source
    assert re.search(r"const float\* __restrict__ res,", source)
    assert re.search(r"\bfloat\* __restrict__ hout,", source)
    assert "residual_dtype=float32" in _problem_line(source)
    assert "HVec" in source
    # h is not rounded to x's dtype anywhere: no pack() of the sum
    assert "const Vec hv = pack(o);" not in source
    if config.cache == "bulk":
        assert "RROW_BYTES" in source


def test_a_plain_residual_kernel_has_no_float32_rows() -> None:
    fam = registry.get("rms_norm")
    problem = RMSProblem(4096, "bfloat16", residual=True)
    source = fam.render(fam.default(problem, H200, 64), problem, H200).source
    assert "HVec" not in source and "residual_dtype" not in source


def test_the_export_takes_float32_residual_and_h(tmp_path: Path) -> None:
    fam = registry.get("rms_norm")
    paths = export_kernel(fam.default(WIDE_RMS, H200, 64), WIDE_RMS, tmp_path)
    header = next(p for p in paths if p.suffix == ".h").read_text()
    assert paths[0].name.startswith("autonorm_add_rms_bf16_h4096_f32res")
    assert re.search(r"const float\* residual,", header)
    assert re.search(r"float\* h,", header)
    assert re.search(r"const autonorm_add_rms_bf16_h4096_f32res_elem\* x,", header)
    assert "typedef __nv_bfloat16 autonorm_add_rms_bf16_h4096_f32res_elem;" in header
    assert "in float32 (residual and h are float32) and stored" in header


@pytest.mark.skipif(offline.nvcc_path() is None, reason="needs nvcc (CI installs it)")
def test_wide_defaults_compile_without_spills() -> None:
    kernels = []
    for op in ("layer_norm", "rms_norm"):
        fam = registry.get(op)
        for hidden, rows in ((1000, 4096), (4096, 1), (8192, 8192), (16384, 4096),
                             (65536, 1), (65536, 1024)):
            problem = fam.problem(hidden=hidden, dtype="bfloat16", residual=True,
                                  residual_dtype="float32")
            kernels.append(fam.render(fam.default(problem, H200, rows), problem, H200))
    reports = offline.compile_offline(kernels)
    spilled = {k.config.label(): reports[k.name] for k in kernels
               if reports[k.name].spill_stores or reports[k.name].spill_loads}
    assert not spilled


def test_the_command_line_renders_a_wide_kernel() -> None:
    status, out, err = invoke(["render", "--op", "rms_norm", "--hidden", "4096", "--residual",
                               "--residual-dtype", "fp32"])
    assert status == 0, err
    assert "residual_dtype=float32" in _problem_line(out)


@pytest.mark.parametrize(("args", "expected"), [
    (["render", "--op", "rms_norm", "--hidden", "4096", "--residual-dtype", "fp32"],
     "--residual-dtype is the dtype of the residual add's h: it needs --residual"),
    (["render", "--hidden", "4096", "--residual", "--residual-dtype", "fp16"],
     "residual_dtype must be float32 or x's dtype"),
    (["tune", "--hidden", "4096,8192", "--residual", "--residual-dtype", "fp32"],
     "--residual-dtype tunes one shape at a time"),
])
def test_bad_residual_dtypes_get_one_line(args: list[str], expected: str) -> None:
    assert_one_error_line(*invoke(args), expected)


@pytest.mark.parametrize("residual_dtype", [None, "float32"])
@pytest.mark.parametrize(("config", "barrier"), [
    (KernelConfig(128, 8, 1, "smem", "two_pass", 1, 0), "row_barrier(group);"),
    (KernelConfig(128, 8, 8, "registers", "two_pass", 1, 0), "__syncwarp(gmask);"),
    (KernelConfig(256, 8, 1, "registers", "two_pass", 2, 0), "cluster.sync();"),
], ids=["warps", "sub-warp", "cluster"])
def test_an_in_place_layernorm_row_reads_its_shift_before_storing_h(
        config: KernelConfig, barrier: str, residual_dtype: str | None) -> None:
    # In place h overwrites the residual's first element, which the shift is read from: the
    # kernel waits, when h and the residual are one array, until every thread has read it.
    problem = LayerNormProblem(512 if config.rows_per_block > 1 else 8192, "bfloat16",
                               residual=True, residual_dtype=residual_dtype)
    source = registry.get("layer_norm").render(config, problem, H200).source
    shift = source.index("const float shift =")
    guard = source.index("if ((const void*)hout == (const void*)res) {", shift)
    wait = source.index(barrier, guard)
    first_store = source.index("keep_sum(hr", shift)
    assert shift < guard < wait < first_store
    # The read must be coherent: a const __restrict__ read may take the non-coherent path,
    # whose loads the barrier does not order before the other threads' stores.
    assert "__ldcg(res + row_base)" in source[shift:guard]
    assert "res[row_base]" not in source


@pytest.mark.skipif(offline.nvcc_path() is None, reason="needs nvcc (CI installs it)")
@pytest.mark.parametrize("residual_dtype", [None, "float32"])
@pytest.mark.parametrize("hidden", [4096, 4099], ids=["aligned", "skewed"])
def test_the_in_place_shift_is_read_coherently_before_the_barrier(
        hidden: int, residual_dtype: str | None) -> None:
    if residual_dtype and hidden % 8:
        pytest.skip("a wide residual takes no skewed rows")
    fam = registry.get("layer_norm")
    problem = LayerNormProblem(hidden, "bfloat16", residual=True, residual_dtype=residual_dtype)
    kernel = fam.render(KernelConfig(128, 8, 1, "smem", "two_pass", 1, 0), problem, H200)
    text = ptx_of(kernel.source)
    barrier = text.index("bar.sync")
    # Before the barrier: x's first element (read-only, either path) and the residual's, by
    # the coherent L2 path; after it, the fill's vector loads.
    assert "ld.global.cg" in text[:barrier]
    loads = [line.split()[0] for line in text[:barrier].splitlines() if "ld.global" in line]
    assert sum(op.startswith("ld.global.nc") for op in loads) <= 1 + (hidden % 8 != 0), loads


@pytest.mark.skipif(offline.nvcc_path() is None, reason="needs nvcc (CI installs it)")
@pytest.mark.parametrize("rows", [64, 4096], ids=["smem", "bulk"])
def test_the_wide_export_compiles_with_plain_nvcc_without_warnings(tmp_path: Path,
                                                                    rows: int) -> None:
    import subprocess

    fam = registry.get("layer_norm")
    problem = LayerNormProblem(16384, "bfloat16", residual=True, residual_dtype="float32")
    config = fam.default(problem, H200, rows)
    assert config.cache == ("smem" if rows == 64 else "bulk")
    paths = export_kernel(config, problem, tmp_path)
    proc = subprocess.run(
        [offline.nvcc_path(), "-arch=sm_90", "-std=c++17", "-Xcompiler", "-Wall,-Wextra", "-c",
         paths[0].name, "-o", "exported.o"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in (proc.stdout + proc.stderr).lower(), proc.stderr
