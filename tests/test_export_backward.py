"""An exported backward kernel comes with a host launcher that launches it as the runtime does.

On the CPU: the files and their names, the launcher's parameters, and (with nvcc) a C++ caller
that compiles against the export, checks the launcher's argument validation and computes the
launcher's grid and workspace by its own C++ rules, which must equal the runtime's
(``LaunchPlan.grid``, ``BackwardProblem.partial_floats``) at every row count, SM count and
occupancy tried. On a GPU: the exported launcher's gradients equal the in-process kernel's bit
for bit, again on a second launch with the same workspace, and rows 0 zeroes the column sums.
"""

from __future__ import annotations

import ctypes
import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from test_export import _host_compilers, _nvcc, _run, assert_exports_only_its_functions

from autonorm.export import default_basename, export_kernel, render_export
from autonorm.ops import registry
from autonorm.ops.norm_backward.config import BackwardConfig
from autonorm.ops.norm_backward.launcher import PARTIALS_OFFSET
from autonorm.runtime.limits import H200

DRIVER = Path(__file__).resolve().parent / "fixtures" / "export_backward_driver.cu"

# (op, problem fields, rows the default is picked for, a configuration or None for the default)
CASES = {
    # The bulk-copy default, no cluster.
    "ln-bf16-4096": ("layer_norm_backward", {"hidden": 4096, "dtype": "bfloat16"}, 16384, None),
    # A cluster of four blocks splits each row.
    "rms-bf16-16384": ("rms_norm_backward", {"hidden": 16384, "dtype": "bfloat16"}, 4096, None),
    # The backward of the residual add, without a bias.
    "add-ln-fp32-1024-nobias": ("layer_norm_backward", {
        "hidden": 1024, "dtype": "float32", "residual": True, "has_bias": False}, 65536, None),
    # No weight: no column sums and no barrier.
    "rms-fp16-4096-noweight": ("rms_norm_backward", {
        "hidden": 4096, "dtype": "float16", "has_weight": False}, 16384, None),
    # Gemma's weight, an odd hidden size (no bulk copy: compute capability 7.5).
    "rms-bf16-3001-offset": ("rms_norm_backward", {
        "hidden": 3001, "dtype": "bfloat16", "weight_offset": True}, 4096, None),
    # A cluster of 16 blocks (non-portable): the launcher allows it before it asks the driver.
    "ln-fp32-65536-c16": ("layer_norm_backward", {"hidden": 65536, "dtype": "float32"}, 1024,
                          None),
    # Groups: one cluster whatever the rows.
    "ln-bf16-4096-groups": ("layer_norm_backward", {"hidden": 4096, "dtype": "bfloat16"}, 64,
                            BackwardConfig(32, 8, "bulk", "smem", 1, stages=1, groups=2)),
    # Column sums formed again from the rows: four statistics a row of partials.
    "ln-fp16-4096-reread": ("layer_norm_backward", {"hidden": 4096, "dtype": "float16"}, 64,
                            BackwardConfig(32, 1, "none", "reread", 1)),
}


def _case(name: str) -> tuple:
    op, fields, rows, config = CASES[name]
    family = registry.get(op)
    problem = family.problem(**fields)
    return family, problem, config or family.default(problem, H200, rows)


def _defines(basename: str) -> list[str]:
    return [f'-DEXPORT_SOURCE="{basename}.cu"', f"-DEXPORT_NAME={basename}",
            f"-DEXPORT_MACRO={basename.upper()}"]


# -- rendering (pure) -------------------------------------------------------------------------


def test_each_variant_has_its_own_name() -> None:
    names = {name: default_basename(_case(name)[1]) for name in CASES}
    assert names["ln-bf16-4096"] == "autonorm_ln_bwd_bf16_h4096"
    assert names["add-ln-fp32-1024-nobias"] == "autonorm_add_ln_bwd_fp32_h1024_nobias"
    assert names["rms-fp16-4096-noweight"] == "autonorm_rms_bwd_fp16_h4096_noweight"
    assert names["rms-bf16-3001-offset"] == "autonorm_rms_bwd_bf16_h3001_offset"
    # Variants of one hidden size, and the forward's export of it, never share a file.
    ln = registry.get("layer_norm_backward")
    variants = {default_basename(ln.problem(hidden=4096, has_weight=w, has_bias=b, residual=r))
                for w in (False, True) for b in (False, True) for r in (False, True)}
    forward = registry.get("layer_norm").problem(hidden=4096)
    assert len(variants) == 8 and default_basename(forward) not in variants


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_launcher_takes_the_pointers_of_its_problem(name: str) -> None:
    _, problem, config = _case(name)
    exported = render_export(config, problem, device=H200)
    basename = exported.basename
    assert set(exported.files) == {f"{basename}.cu", f"{basename}.h", f"{basename}.json"}
    manifest = exported.manifest
    names = [p["name"] for p in manifest["parameters"]]
    expected = (["dy", "x"] + ["weight"] * problem.has_weight + ["dh"] * problem.residual
                + ["dx"] + ["dweight"] * problem.has_weight + ["dbias"] * problem.has_bias
                + ["rows", "eps", "workspace", "workspace_bytes", "stream"])
    assert names == expected
    # The header declares the function with the manifest's parameters, in its order.
    declaration = exported.header.split(f"cudaError_t {manifest['function']}(", 1)[1]
    declared = re.findall(r"(\w+)[,)]", declaration.split(";", 1)[0])
    assert declared == names
    assert manifest["how_to_launch"]["launcher"] == manifest["function"]
    assert manifest["files"] == {"source": f"{basename}.cu", "header": f"{basename}.h"}
    # The kernel is in the source verbatim, before the launcher that calls it.
    source = exported.source
    assert exported.kernel.source in source
    assert source.index(exported.kernel.source) < source.index(f"{exported.kernel.name}<<<")
    if problem.sums:
        assert "zeroes" in exported.header and "grid barrier" in exported.header


def test_the_default_export_of_the_cli_writes_the_launcher(tmp_path: Path) -> None:
    _, problem, config = _case("ln-bf16-4096")
    paths = export_kernel(config, problem, tmp_path)
    assert [p.name for p in paths] == ["autonorm_ln_bwd_bf16_h4096.cu",
                                       "autonorm_ln_bwd_bf16_h4096.h",
                                       "autonorm_ln_bwd_bf16_h4096.json"]
    manifest = json.loads(paths[-1].read_text())
    assert manifest["function"] == "autonorm_ln_bwd_bf16_h4096_backward"
    assert manifest["function_workspace_bytes"] == "autonorm_ln_bwd_bf16_h4096_workspace_bytes"


# -- nvcc: the launcher compiles, validates and sizes its launches as the runtime --------------


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_launcher_compiles_validates_and_sizes_as_the_runtime(
    tmp_path: Path, name: str
) -> None:
    nvcc = _nvcc()
    _, problem, config = _case(name)
    exported = render_export(config, problem, device=H200)
    basename = exported.basename
    for file, text in exported.files.items():
        (tmp_path / file).write_text(text)
    arch = "sm_90" if exported.manifest["target"]["min_compute_capability"] >= 90 else "sm_75"
    proc = _run([nvcc, f"-arch={arch}", "-std=c++17", "-Xcompiler", "-Wall,-Wextra", "-I",
                 str(tmp_path), *_defines(basename), "-o", "prog", str(DRIVER)], tmp_path)
    assert "warning" not in (proc.stdout + proc.stderr).lower(), proc.stderr
    checked = subprocess.run([str(tmp_path / "prog"), "validate"], capture_output=True,
                             text=True, check=False)
    assert checked.returncode == 0 and checked.stdout.strip() == "ok", (
        checked.stdout + checked.stderr)

    plan = exported.kernel.launch
    cases = [(rows, sms, resident)
             for sms in (132, 66, 7)
             for resident in (sms * 8 // plan.cluster, 30, 3, 0)
             for rows in (1, 2, 5, 16, 17, 100, 4096, 10**6)]
    text = "".join(f"{r} {s} {f}\n" for r, s, f in cases)
    sized = subprocess.run([str(tmp_path / "prog"), "grid"], input=text, capture_output=True,
                           text=True, check=True)
    lines = sized.stdout.split("\n")
    for (rows, sms, resident), line in zip(cases, lines, strict=False):
        grid = plan.grid(rows, sms, resident or None)
        floats = problem.partial_floats(rows, grid // plan.cluster)
        assert line.split() == [str(grid), str(PARTIALS_OFFSET + 4 * floats)], (
            rows, sms, resident)
    assert len([line for line in lines if line]) == len(cases)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_source_alone_builds_a_library_without_warnings(tmp_path: Path, name: str) -> None:
    """The ``.cu`` as a user builds it (not included by a caller): no warning, no shared state."""
    nvcc = _nvcc()
    _, problem, config = _case(name)
    exported = render_export(config, problem, device=H200)
    for file, text in exported.files.items():
        (tmp_path / file).write_text(text)
    arch = "sm_90" if exported.manifest["target"]["min_compute_capability"] >= 90 else "sm_75"
    lib = tmp_path / "libexport.so"
    proc = _run([nvcc, f"-arch={arch}", "-std=c++17", "-shared", "-Xcompiler",
                 "-fPIC,-Wall,-Wextra", f"{exported.basename}.cu", "-o", str(lib)], tmp_path)
    assert "warning" not in (proc.stdout + proc.stderr).lower(), proc.stderr
    assert_exports_only_its_functions(lib, exported.basename)


def test_the_header_compiles_with_a_plain_host_compiler(tmp_path: Path) -> None:
    # A caller's host code includes the header without nvcc: C++ and C alike.
    gxx, gcc, include = _host_compilers()
    for name in ("ln-bf16-4096", "rms-fp16-4096-noweight", "add-ln-fp32-1024-nobias"):
        _, problem, config = _case(name)
        export_kernel(config, problem, tmp_path)
        basename = default_basename(problem)
        (tmp_path / "use.cpp").write_text(f'#include "{basename}.h"\n')
        (tmp_path / "use.c").write_text(f'#include "{basename}.h"\n')
        _run([gxx, "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-I", str(include),
              "use.cpp"], tmp_path)
        # C has no __nv_bfloat16 or __half: the header declares CUDA's two-byte structs there.
        _run([gcc, "-std=c11", "-fsyntax-only", "-Wall", "-Wextra", "-I", str(include),
              "use.c"], tmp_path)


# -- GPU: the exported launcher equals the in-process kernel, bit for bit ----------------------


def _stored(values: np.ndarray, dtype: str):  # noqa: ANN202 - a CuPy array
    """``values`` rounded to ``dtype``'s storage, on the GPU (bfloat16 as uint16 bits)."""
    import cupy

    from autonorm.numerics import from_float64

    return cupy.asarray(from_float64(values, dtype))


def _poisoned(shape: tuple, like):  # noqa: ANN001, ANN202 - CuPy arrays
    """An array of ``like``'s dtype with every byte 0xFF: NaN in each dtype, so a gap shows."""
    import cupy

    out = cupy.empty(shape, dtype=like.dtype)
    out.view(cupy.uint8).fill(0xFF)
    return out


def _unwritten(a) -> bool:  # noqa: ANN001 - a CuPy array
    """Whether some element of ``a`` still has every byte 0xFF."""
    import cupy

    raw = a.view(cupy.uint8).reshape(-1, a.itemsize)
    return bool((raw == 0xFF).all(axis=1).any())


def _ptr(a) -> int:  # noqa: ANN001 - a CuPy array or None
    return 0 if a is None else a.data.ptr


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_the_exported_launcher_matches_the_in_process_kernel(tmp_path: Path, name: str) -> None:
    cupy = pytest.importorskip("cupy")
    nvcc = _nvcc()
    from autonorm.runtime import compiler
    from autonorm.runtime.device import query_device

    family, problem, config = _case(name)
    info = query_device()
    limits = info.limits()
    if family.check(config, problem, limits):
        pytest.skip(f"{config.label()} cannot run on {info.name}")
    kernel = compiler.compile_kernel(family.render(config, problem, limits))
    exported = render_export(config, problem, device=limits)
    for file, text in exported.files.items():
        (tmp_path / file).write_text(text)
    lib = tmp_path / "libexport.so"
    _run([nvcc, f"-arch={info.arch}", "-std=c++17", "-shared", "-Xcompiler", "-fPIC",
          "-DEXPORT_DRIVER_NO_MAIN", "-I", str(tmp_path), *_defines(exported.basename),
          "-o", str(lib), str(DRIVER)], tmp_path)
    so = ctypes.CDLL(str(lib))
    backward = so.export_driver_backward
    backward.argtypes = [ctypes.c_void_p] * 7 + [ctypes.c_int, ctypes.c_float, ctypes.c_void_p,
                                                 ctypes.c_ulonglong, ctypes.c_void_p]
    backward.restype = ctypes.c_int
    sizing = so.export_driver_workspace_bytes
    sizing.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_ulonglong)]
    sizing.restype = ctypes.c_int

    n, eps = problem.hidden, 1e-5
    rng = np.random.default_rng(0)
    w = _stored(rng.normal(1.0, 0.5, n), problem.dtype) if problem.has_weight else None

    def outputs(rows: int, like) -> tuple:  # noqa: ANN001
        dw = _poisoned((n,), like) if problem.has_weight else None
        db = _poisoned((n,), like) if problem.has_bias else None
        return _poisoned((rows, n), like), dw, db

    for rows in (1, 3, 300):
        x = _stored(rng.normal(3.0, 2.0, (rows, n)), problem.dtype)
        dy = _stored(rng.normal(0.0, 1.0, (rows, n)), problem.dtype)
        dh = _stored(rng.normal(0.0, 1.0, (rows, n)), problem.dtype) if problem.residual else None
        size = ctypes.c_ulonglong(0)
        assert sizing(rows, ctypes.byref(size)) == 0
        clusters = kernel.grid(rows) // kernel.plan.cluster
        assert size.value == PARTIALS_OFFSET + 4 * problem.partial_floats(rows, clusters)
        workspace = cupy.zeros(size.value // 4, dtype=cupy.uint32)

        want = outputs(rows, x)
        partials = cupy.empty(problem.partial_floats(rows, clusters), dtype=cupy.float32)
        kernel.launch_arrays(x, dy, w, *want, partials, dh, rows, eps)
        cupy.cuda.runtime.deviceSynchronize()
        assert not any(_unwritten(a) for a in want if a is not None), "in-process: a gap"
        for _ in range(2):  # the same workspace twice: the kernel leaves its counter zeroed
            got = outputs(rows, x)
            code = backward(_ptr(dy), _ptr(x), _ptr(w), _ptr(dh), *map(_ptr, got), rows, eps,
                            _ptr(workspace), size.value, None)
            assert code == 0, f"exported launcher returned cudaError {code}"
            cupy.cuda.runtime.deviceSynchronize()
            assert workspace[:2].get().tolist() == [0, 0]
            for mine, theirs in zip(got, want, strict=True):
                if theirs is not None:
                    assert bool(cupy.array_equal(mine.view(cupy.uint8),
                                                 theirs.view(cupy.uint8))), (rows, "differs")
        # A workspace one byte short is refused before anything launches.
        short = backward(_ptr(dy), _ptr(x), _ptr(w), _ptr(dh), *map(_ptr, got), rows, eps,
                         _ptr(workspace), size.value - 1, None)
        assert short == 1  # cudaErrorInvalidValue

    # No rows: nothing launches, the inputs may be null, and sums over no rows are zero.
    _, dw, db = outputs(1, x)
    assert backward(0, 0, 0, 0, 0, _ptr(dw), _ptr(db), 0, eps, 0, 0, None) == 0
    cupy.cuda.runtime.deviceSynchronize()
    for sums in (dw, db):
        if sums is not None:
            assert not bool(sums.view(cupy.uint8).any())
