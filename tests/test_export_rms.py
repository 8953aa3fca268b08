"""Tests of RMSNorm exports: the header says RMSNorm's formula, Gemma's ``1 + weight`` and the
residual add; the launcher of a residual kernel takes its extra pointers in the kernel's order;
the manifest lists the parameters the header declares; the ``.cu`` compiles with plain nvcc
without warnings and a C++ caller links against it; (GPU) the exported launcher computes what
the in-process kernel does, bit for bit, in place too."""

from __future__ import annotations

import ctypes
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from autonorm.codegen.spellings import CTYPES
from autonorm.export import default_basename, export_kernel, render_export
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.plan import smem_bytes
from autonorm.ops.layer_norm.problem import Problem as LayerNormProblem
from autonorm.ops.layer_norm.space import default_config
from autonorm.ops.rms_norm.family import FAMILY, RESIDUAL_ABI
from autonorm.ops.rms_norm.problem import Problem
from autonorm.runtime import offline
from autonorm.runtime.limits import H200

PLAIN = Problem(4096)
OFFSET = Problem(4096, weight_offset=True)
BARE = Problem(4096, "float16", has_weight=False)
ADD = Problem(4096, residual=True)
ADD_OFFSET = Problem(1000, "float32", weight_offset=True, residual=True)
ADD_BARE = Problem(2048, "float16", has_weight=False, residual=True)
ADD_SKEWED = Problem(1001, "bfloat16", residual=True)  # rows off 16-byte boundaries

# Launch-plan features with the residual add: a cluster, a persistent grid, a kernel over
# 48 KiB of shared memory and the bulk-copy kernel, whose tiles stage the residual too.
ADD_CLUSTER = KernelConfig(256, 8, 1, "registers", "two_pass", 2, 0)
ADD_BULK = KernelConfig(256, 8, 1, "bulk", "two_pass", 4, 0, stages=2)
ADD_PERSISTENT = KernelConfig(256, 8, 1, "smem", "two_pass", 1, 2)
ADD_BIG_SMEM = KernelConfig(1024, 8, 1, "smem", "two_pass", 1, 0)
ADD_WIDE = Problem(16384, residual=True)
ADD_HUGE = Problem(65536, "float16", residual=True)

ALL = [PLAIN, OFFSET, BARE, ADD, ADD_OFFSET, ADD_BARE, ADD_SKEWED]


def _id(problem: Problem) -> str:
    return default_basename(problem).removeprefix("autonorm_")


def _export(problem: Problem, config: KernelConfig | None = None):  # noqa: ANN202
    return render_export(config or FAMILY.default(problem, H200), problem)


def _declared(text: str, function: str) -> list[tuple[str, str]]:
    """The (C type, name) parameters ``function`` is declared or defined with in ``text``."""
    match = re.search(rf"cudaError_t {function}\(([^)]*)\)", text)
    assert match is not None, f"{function} is not declared"
    params = [" ".join(p.split()) for p in match.group(1).split(",")]
    return [tuple(p.rsplit(" ", 1)) for p in params]  # type: ignore[misc]


def _call_args(source: str, kernel: str) -> list[str]:
    """The arguments the launcher passes ``kernel`` (its one launch), comments dropped."""
    call = source[source.index(f"{kernel}<<<"):]
    call = call[call.index(">>>(") + 4: call.index(";")]
    call = re.sub(r"//[^\n]*", "", call)
    return [a.strip() for a in call.rstrip(") \n").split(",")]


def _kernel_params(source: str, kernel: str) -> list[str]:
    """The parameter names of the ``__global__`` function ``kernel`` in the rendered source."""
    signature = source[source.index(f"\n{kernel}(") + len(kernel) + 2:]
    signature = signature[: signature.index(")")]
    return [p.split()[-1].lstrip("*") for p in signature.split(",")]


# -- what the header says -----------------------------------------------------------------------


@pytest.mark.parametrize("problem", [PLAIN, OFFSET, BARE], ids=_id)
def test_the_header_gives_rmsnorms_formula_not_layernorms(problem: Problem) -> None:
    exported = _export(problem)
    header, name = exported.header, default_basename(problem)
    assert header.startswith(f"// {name}.h: RMSNorm forward exported by autonorm")
    assert exported.source.startswith(f"// {name}.cu: RMSNorm forward exported by autonorm")
    scale = {PLAIN: " * weight", OFFSET: " * (1 + weight)", BARE: ""}[problem]
    assert f" *   y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps){scale}\n" in header
    assert "the mean of the squares accumulated in fp32" in header
    assert "var(" not in header and "biased variance" not in header and "LayerNorm" not in header
    assert ("The weight is Gemma's: stored as its offset from one" in header) == (
        problem.weight_offset)
    assert ("this variant has no weight." in header) == (not problem.has_weight)
    macro = name.upper()
    assert f"#define {macro}_WEIGHT_OFFSET {int(problem.weight_offset)}\n" in header
    assert f"#define {macro}_RESIDUAL 0\n" in header
    assert f"#define {macro}_HAS_BIAS 0\n" in header  # RMSNorm has none
    assert "h[r, :]" not in header
    assert [n for _, n in _declared(header, f"{name}_forward")] == (
        ["x", "weight", "y", "rows", "eps", "stream"] if problem.has_weight
        else ["x", "y", "rows", "eps", "stream"])


@pytest.mark.parametrize("problem", [ADD, ADD_OFFSET, ADD_BARE], ids=_id)
def test_the_residual_header_gives_the_add_and_its_in_place_use(problem: Problem) -> None:
    exported = _export(problem)
    header, name = exported.header, default_basename(problem)
    assert header.startswith(f"// {name}.h: residual add + RMSNorm forward exported by")
    assert (f" *   h[r, :] = x[r, :] + residual[r, :], rounded to {problem.dtype} and stored\n"
            " *   y[r, :] = h[r, :] / sqrt(mean(h[r, :]^2) + eps)") in header
    assert "y is the norm of exactly the h stored" in header
    assert f"x, residual, y and h are [rows, {problem.hidden}]" in header
    weight = "weight, " if problem.has_weight else ""
    assert f"{name}_forward(x, residual, {weight}x, residual, rows, eps, stream);" in header
    assert "pass x as y and residual as h" in header
    assert f"#define {name.upper()}_RESIDUAL 1\n" in header
    element = f"// Element type of x, residual, {weight}y, h: {problem.dtype}."
    assert element in header


# -- the launcher's parameters: header, definition, manifest and kernel agree -------------------


@pytest.mark.parametrize("problem", ALL, ids=_id)
def test_the_manifest_lists_the_parameters_the_header_and_source_declare(
    problem: Problem
) -> None:
    exported = _export(problem)
    name, manifest = default_basename(problem), exported.manifest
    for function, key in ((f"{name}_forward", "parameters"),
                          (f"{name}_forward_ws", "parameters_with_workspace")):
        listed = [(p["type"], p["name"]) for p in manifest[key]]
        # The header declares 16-bit elements by its typedef: CUDA's type in C++ (the
        # manifest's), the two-byte struct in C.
        header = exported.header.replace(f"{name}_elem", CTYPES[problem.dtype])
        assert _declared(header, function) == listed
        assert _declared(exported.source, function) == listed
    names = [p["name"] for p in manifest["parameters"]]
    pointers = (["x", "residual"] if problem.residual else ["x"]) + (
        ["weight"] if problem.has_weight else []) + (["y", "h"] if problem.residual else ["y"])
    assert names == [*pointers, "rows", "eps", "stream"]
    ws_names = [p["name"] for p in manifest["parameters_with_workspace"]]
    assert ws_names == [*pointers, "rows", "eps", "workspace", "stream"]
    # The plain launcher forwards every one of its arguments to the workspace one.
    forward = f"return {name}_forward_ws({', '.join(names[:-1])}, nullptr, stream);"
    assert forward in exported.source


@pytest.mark.parametrize("problem", ALL, ids=_id)
def test_the_launcher_passes_the_kernel_its_arguments_in_the_kernels_order(
    problem: Problem
) -> None:
    exported = _export(problem)
    kernel = exported.kernel
    params = _kernel_params(kernel.source, kernel.name)
    args = _call_args(exported.source, kernel.name)
    assert len(args) == len(params)
    by_param = dict(zip(params, args, strict=True))
    assert by_param["x"] == "x" and by_param["y"] == "y" and by_param["b"] == "nullptr"
    assert by_param["w"] == ("weight" if problem.has_weight else "nullptr")
    assert (by_param["rows"], by_param["eps"], by_param["work"]) == ("rows", "eps", "nullptr")
    if problem.residual:
        assert (by_param["res"], by_param["hout"]) == ("residual", "h")
        # The order the runtime launches by (the family's ABI) is the order exported.
        assert FAMILY.kernel_abi(kernel) == RESIDUAL_ABI
        assert args.index("rows") == RESIDUAL_ABI.rows_index
        assert len(args) == len(RESIDUAL_ABI.params) + RESIDUAL_ABI.workspace
        assert "if (!aligned16(residual) || !aligned16(h)) return cudaErrorInvalidValue;" in (
            exported.source)
    else:
        assert "res" not in by_param and "hout" not in by_param
        assert "aligned16(residual)" not in exported.source


def test_a_layernorm_manifest_keeps_its_entries() -> None:
    problem = LayerNormProblem(4096)
    exported = render_export(default_config(problem), problem)
    assert "parameters" not in exported.manifest
    assert "parameters_with_workspace" not in exported.manifest
    assert "_RESIDUAL" not in exported.header and "_WEIGHT_OFFSET" not in exported.header
    assert exported.header.startswith("// autonorm_ln_bf16_h4096.h: LayerNorm forward exported")


@pytest.mark.parametrize(("config", "problem"), [(ADD_CLUSTER, ADD_WIDE),
                                                 (ADD_PERSISTENT, ADD_WIDE),
                                                 (ADD_BIG_SMEM, ADD_HUGE),
                                                 (ADD_BULK, ADD_HUGE)],
                         ids=["cluster", "persistent", "big-smem", "bulk"])
def test_residual_launch_plans_keep_their_features(config: KernelConfig,
                                                   problem: Problem) -> None:
    exported = _export(problem, config)
    source = exported.source
    assert FAMILY.check(config, problem, H200) == []
    assert ("__cluster_dims__(2, 1, 1)" in source) == (config.cluster == 2)
    assert ("cp.async.bulk" in source) == (config.cache == "bulk")
    # A persistent grid sizes itself by the SM count (the bulk kernel's always is one).
    persistent = config.blocks_per_sm > 0 or config.cache == "bulk"
    assert ("cudaDevAttrMultiProcessorCount" in source) == persistent
    big = smem_bytes(config, problem) > 48 * 1024
    assert ("cudaFuncAttributeMaxDynamicSharedMemorySize" in source) == big
    assert _call_args(source, exported.kernel.name)[:6] == ["x", "residual", "weight",
                                                             "nullptr", "y", "h"]


# -- nvcc: the exported source compiles without warnings, a caller links ------------------------


def _nvcc() -> str:
    nvcc = offline.nvcc_path()
    if nvcc is None:
        pytest.skip("nvcc not found on PATH: compiling exported kernels needs the CUDA toolkit")
    return nvcc


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return proc


COMPILED = [
    pytest.param(None, PLAIN, id="plain"),
    pytest.param(None, OFFSET, id="offset"),
    pytest.param(None, ADD, id="residual"),
    pytest.param(None, ADD_SKEWED, id="residual-skewed"),
    pytest.param(ADD_BIG_SMEM, Problem(65536, "float16", has_weight=False, residual=True),
                 id="residual-noweight-big-smem"),
    pytest.param(ADD_CLUSTER, ADD_WIDE, id="residual-cluster"),
    pytest.param(ADD_BULK, ADD_HUGE, id="residual-bulk"),
]


@pytest.mark.parametrize(("config", "problem"), COMPILED)
def test_the_exported_source_compiles_with_plain_nvcc_without_warnings(
    tmp_path: Path, config: KernelConfig | None, problem: Problem
) -> None:
    nvcc = _nvcc()
    paths = export_kernel(config or FAMILY.default(problem, H200), problem, tmp_path)
    proc = _run([nvcc, "-arch=sm_90", "-std=c++17", "-Xcompiler", "-Wall,-Wextra", "-c",
                 paths[0].name, "-o", "exported.o"], tmp_path)
    assert "warning" not in (proc.stdout + proc.stderr).lower(), proc.stderr
    assert (tmp_path / "exported.o").stat().st_size > 0


# A caller of any RMSNorm export: it calls the launcher with the pointers its header says it
# takes. `validate` checks the argument validation, which returns before any CUDA call.
DRIVER = r"""
#include EXPORT_HEADER

#include <cstdint>
#include <cstdio>

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define FORWARD CAT(EXPORT_NAME, _forward)
#define FORWARD_WS CAT(EXPORT_NAME, _forward_ws)
#define HAS_WEIGHT CAT(EXPORT_MACRO, _HAS_WEIGHT)
#define RESIDUAL CAT(EXPORT_MACRO, _RESIDUAL)

typedef CAT(EXPORT_NAME, _elem) elem_t;

#if RESIDUAL
#define RES_ARG static_cast<const elem_t*>(r),
#define H_ARG static_cast<elem_t*>(h),
#else
#define RES_ARG
#define H_ARG
#endif
#if HAS_WEIGHT
#define W_ARG static_cast<const elem_t*>(w),
#else
#define W_ARG
#endif

static int call(const void* x, const void* r, const void* w, void* y, void* h, int rows,
                float eps, void* ws, bool with_ws) {
  (void)r;
  (void)w;
  (void)h;
  if (with_ws) {
    return static_cast<int>(FORWARD_WS(static_cast<const elem_t*>(x), RES_ARG W_ARG
                                       static_cast<elem_t*>(y), H_ARG rows, eps,
                                       static_cast<unsigned int*>(ws), nullptr));
  }
  return static_cast<int>(FORWARD(static_cast<const elem_t*>(x), RES_ARG W_ARG
                                  static_cast<elem_t*>(y), H_ARG rows, eps, nullptr));
}

static int expect(const char* what, int got, int want) {
  if (got == want) return 0;
  std::fprintf(stderr, "%s: got error %d, want %d\n", what, got, want);
  return 1;
}

int main() {
  void* a = reinterpret_cast<void*>(std::uintptr_t{0x10000});
  void* b = reinterpret_cast<void*>(std::uintptr_t{0x20000});
  void* c = reinterpret_cast<void*>(std::uintptr_t{0x30000});
  void* d = reinterpret_cast<void*>(std::uintptr_t{0x40000});
  void* odd = reinterpret_cast<void*>(std::uintptr_t{0x50008});
  void* ws_odd = reinterpret_cast<void*>(std::uintptr_t{0x60002});
  const int bad = cudaErrorInvalidValue;
  int failures = 0;
  failures += expect("rows < 0", call(a, b, c, d, a, -1, 1e-5f, nullptr, false), bad);
  failures += expect("eps = 0", call(a, b, c, d, a, 4, 0.0f, nullptr, false), bad);
  failures += expect("null x", call(nullptr, b, c, d, a, 4, 1e-5f, nullptr, false), bad);
  failures += expect("null y", call(a, b, c, nullptr, a, 4, 1e-5f, nullptr, false), bad);
  failures += expect("x misaligned", call(odd, b, c, d, a, 4, 1e-5f, nullptr, false), bad);
  failures += expect("y misaligned", call(a, b, c, odd, a, 4, 1e-5f, nullptr, false), bad);
#if RESIDUAL
  failures += expect("null residual", call(a, nullptr, c, d, a, 4, 1e-5f, nullptr, false), bad);
  failures += expect("null h", call(a, b, c, d, nullptr, 4, 1e-5f, nullptr, false), bad);
  failures += expect("residual misaligned", call(a, odd, c, d, a, 4, 1e-5f, nullptr, false), bad);
  failures += expect("h misaligned", call(a, b, c, d, odd, 4, 1e-5f, nullptr, false), bad);
#endif
#if HAS_WEIGHT
  failures += expect("null weight", call(a, b, nullptr, d, a, 4, 1e-5f, nullptr, false), bad);
  failures += expect("w misaligned", call(a, b, odd, d, a, 4, 1e-5f, nullptr, false), bad);
#endif
  failures += expect("rows = 0", call(a, b, c, d, a, 0, 1e-5f, nullptr, false), 0);
  failures += expect("workspace misaligned", call(a, b, c, d, a, 4, 1e-5f, ws_odd, true), bad);
  failures += expect("ws: rows = 0", call(a, b, c, d, a, 0, 1e-5f, a, true), 0);
  std::printf("%s\n", failures ? "FAILED" : "ok");
  return failures ? 1 : 0;
}
"""


@pytest.mark.parametrize("problem", [OFFSET, ADD, ADD_BARE], ids=_id)
def test_a_caller_links_against_the_export_and_bad_arguments_launch_nothing(
    tmp_path: Path, problem: Problem
) -> None:
    nvcc = _nvcc()
    paths = export_kernel(FAMILY.default(problem, H200), problem, tmp_path)
    name = default_basename(problem)
    (tmp_path / "driver.cu").write_text(DRIVER)
    _run([nvcc, "-arch=sm_90", "-std=c++17", "-I", str(tmp_path),
          f'-DEXPORT_HEADER="{name}.h"', f"-DEXPORT_NAME={name}",
          f"-DEXPORT_MACRO={name.upper()}", "-o", "prog", "driver.cu", paths[0].name], tmp_path)
    proc = subprocess.run([str(tmp_path / "prog")], capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr


# -- GPU: the exported launcher computes what the in-process kernel does ------------------------


_CTYPES = {"int": ctypes.c_int, "float": ctypes.c_float}


def _bind(lib: ctypes.CDLL, manifest: dict) -> Any:
    """The export's launcher, typed from the manifest's parameter list alone."""
    function = getattr(lib, manifest["function"])
    function.argtypes = [_CTYPES.get(p["type"], ctypes.c_void_p) for p in manifest["parameters"]]
    function.restype = ctypes.c_int
    return function


def _bits(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, scale: float,
          offset: float = 0.0) -> np.ndarray:
    values = rng.normal(offset, scale, shape)
    if dtype == "float32":
        return values.astype(np.float32)
    if dtype == "float16":
        return values.astype(np.float16)
    bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


@pytest.mark.gpu
@pytest.mark.parametrize(("config", "problem"), [
    pytest.param(None, PLAIN, id="plain"),
    pytest.param(None, OFFSET, id="offset"),
    pytest.param(None, ADD, id="residual"),
    pytest.param(None, ADD_SKEWED, id="residual-skewed"),
    pytest.param(None, ADD_OFFSET, id="residual-fp32-offset"),
    pytest.param(ADD_CLUSTER, ADD_WIDE, id="residual-cluster"),
    pytest.param(ADD_BIG_SMEM, ADD_HUGE, id="residual-big-smem"),
])
def test_the_exported_launcher_matches_the_in_process_kernel_bitwise(
    tmp_path: Path, config: KernelConfig | None, problem: Problem
) -> None:
    cupy = pytest.importorskip("cupy")
    nvcc = _nvcc()
    from autonorm.runtime import compiler
    from autonorm.runtime.device import query_device

    info = query_device()
    limits = info.limits()
    config = config or FAMILY.default(problem, limits)
    if FAMILY.check(config, problem, limits):
        pytest.skip(f"{config.label()} cannot run on {info.name}")
    rendered = FAMILY.render(config, problem, limits)
    kernel = compiler.compile_kernel(rendered)
    paths = export_kernel(config, problem, tmp_path, device=limits)
    manifest = json.loads(paths[2].read_text())
    lib = tmp_path / "libexport.so"
    _run([nvcc, f"-arch={info.arch}", "-std=c++17", "-shared", "-Xcompiler", "-fPIC",
          "-o", str(lib), paths[0].name], tmp_path)
    forward = _bind(ctypes.CDLL(str(lib)), manifest)

    rows, eps, hidden, dtype = 300, 1e-5, problem.hidden, problem.dtype
    rng = np.random.default_rng(0)
    x = cupy.asarray(_bits(rng, (rows, hidden), dtype, 2.0, 3.0))
    r = cupy.asarray(_bits(rng, (rows, hidden), dtype, 2.0, -1.0))
    w = cupy.asarray(_bits(rng, (hidden,), dtype, 0.5, 1.0)) if problem.has_weight else None
    # Compared as bits; poisoned with every bit set (NaN), so an element left unwritten shows.
    bits = cupy.int32 if dtype == "float32" else cupy.int16
    poison = cupy.full((rows, hidden), -1, dtype=bits).view(x.dtype)
    wp = [] if w is None else [w.data.ptr]

    def same(a: Any, b: Any) -> bool:
        return bool(cupy.array_equal(a.view(bits), b.view(bits)))

    y_ref, h_ref = poison.copy(), poison.copy()
    if problem.residual:
        kernel.launch_arrays(x, r, w, None, y_ref, h_ref, rows, eps)
    else:
        kernel.launch_arrays(x, w, None, y_ref, rows, eps)
    cupy.cuda.runtime.deviceSynchronize()
    assert not bool((y_ref.view(bits) == -1).any()), "in-process kernel left rows unwritten"

    y, h = poison.copy(), poison.copy()
    if problem.residual:
        args = [x.data.ptr, r.data.ptr, *wp, y.data.ptr, h.data.ptr, rows, eps, None]
    else:
        args = [x.data.ptr, *wp, y.data.ptr, rows, eps, None]
    assert forward(*args) == 0
    cupy.cuda.runtime.deviceSynchronize()
    assert same(y, y_ref), "outputs differ"
    if not problem.residual:
        return
    assert same(h, h_ref), "the stored sums differ"

    # In place, as the header says: y = x and h = residual give the same bits.
    x_in, r_in = x.copy(), r.copy()
    assert forward(x_in.data.ptr, r_in.data.ptr, *wp, x_in.data.ptr, r_in.data.ptr, rows, eps,
                   None) == 0
    cupy.cuda.runtime.deviceSynchronize()
    assert same(x_in, y_ref) and same(r_in, h_ref), "in place differs from out of place"
    # A misaligned residual launches nothing.
    assert forward(x.data.ptr, r.data.ptr + 2, *wp, y.data.ptr, h.data.ptr, rows, eps,
                   None) == 1  # cudaErrorInvalidValue
