"""Tests of autonorm.export: the exported .cu/.h compile and link with plain nvcc, the manifest
round-trips, export_from_db picks the tuned winner, and (GPU) the exported kernel's output equals
the in-process kernel's bit for bit."""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import shutil
import subprocess
import warnings
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from autonorm import export, lookup
from autonorm.codegen.kernel import DYNAMIC_MIN_TILES, LaunchPlan
from autonorm.errors import ConfigError
from autonorm.export import (
    DefaultConfigWarning,
    default_basename,
    export_from_db,
    export_kernel,
    render_export,
)
from autonorm.ops import registry
from autonorm.ops.layer_norm.codegen import code_version, render
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.plan import smem_bytes
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.rules import check
from autonorm.ops.layer_norm.space import default_config
from autonorm.runtime import compiler, offline
from autonorm.runtime.device import DeviceInfo
from autonorm.store.db import TuningDB, TuningKey

FIXTURES = Path(__file__).resolve().parent / "fixtures"
DRIVER = FIXTURES / "export_driver.cu"

H200 = DeviceInfo("NVIDIA H200", 90, 132, 62914560, 232448, 6144, 3201000)
A100 = DeviceInfo("NVIDIA A100-SXM4-80GB", 80, 108, 41943040, 166912, 5120, 1593000)

CLUSTER = KernelConfig(256, 8, 1, "registers", "welford", 2, 0)
PERSISTENT = KernelConfig(256, 8, 1, "registers", "two_pass", 1, 2)
BIG_SMEM = KernelConfig(1024, 8, 1, "smem", "two_pass", 1, 0)
# Bulk-copy kernels (resident plans): no cluster and 4 rows per tile, and a cluster of 2; both
# over 48 KiB of shared memory, so the launcher opts in before it asks the occupancy API.
BULK = KernelConfig(256, 8, 4, "bulk", "two_pass", 1, 0, 3)
BULK_PROBLEM = Problem(2048, "bfloat16")
BULK_CLUSTER = KernelConfig(512, 8, 1, "bulk", "two_pass", 2, 0, 2)
BULK_CLUSTER_PROBLEM = Problem(65536, "bfloat16")


def _case(
    hidden: int,
    dtype: str,
    weight: bool = True,
    bias: bool = True,
    config: KernelConfig | None = None,
) -> object:
    problem = Problem(hidden, dtype, weight, bias)
    return pytest.param(config or default_config(problem), problem, id=_case_id(problem, config))


def _case_id(problem: Problem, config: KernelConfig | None) -> str:
    flags = f"{'w' if problem.has_weight else ''}{'b' if problem.has_bias else ''}" or "plain"
    return f"{problem.dtype}-h{problem.hidden}-{flags}-{config.label() if config else 'default'}"


# Each dtype, with and without weight and bias, a cluster, a persistent and a big-smem kernel.
CASES = [
    _case(1000, "float32"),
    _case(4096, "float16", True, False),
    _case(4096, "bfloat16", False, True),
    _case(768, "bfloat16", False, False),
    _case(16384, "bfloat16", config=CLUSTER),
    _case(16384, "bfloat16", config=PERSISTENT),
    _case(65536, "float16", config=BIG_SMEM),
]
BULK_CASES = [_case(2048, "bfloat16", config=BULK), _case(65536, "bfloat16", config=BULK_CLUSTER)]


def _nvcc() -> str:
    nvcc = offline.nvcc_path()
    if nvcc is None:
        pytest.skip("nvcc not found on PATH: compiling exported kernels needs the CUDA toolkit")
    return nvcc


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return proc


def _driver_defines(basename: str) -> list[str]:
    return [
        f'-DEXPORT_HEADER="{basename}.h"',
        f"-DEXPORT_NAME={basename}",
        f"-DEXPORT_MACRO={basename.upper()}",
    ]


def _bf16_bits(values: np.ndarray) -> np.ndarray:
    """Round float32 values to bfloat16 (nearest even) and return the bits as uint16."""
    bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def _bits(values: np.ndarray, dtype: str) -> np.ndarray:
    """Return ``values`` rounded to a 16-bit ``dtype`` (bfloat16 or float16) as uint16 bits."""
    if dtype == "bfloat16":
        return _bf16_bits(values)
    return values.astype(np.float16).view(np.uint16)


# -- rendering (pure) -------------------------------------------------------------------------


def test_default_basename_names_dtype_hidden_and_missing_affine() -> None:
    assert default_basename(Problem(16384, "bf16")) == "autonorm_ln_bf16_h16384"
    assert default_basename(Problem(1000, "float32")) == "autonorm_ln_fp32_h1000"
    assert default_basename(Problem(768, "fp16", False, True)) == "autonorm_ln_fp16_h768_noweight"
    assert default_basename(Problem(768, "fp16", True, False)) == "autonorm_ln_fp16_h768_nobias"


def test_render_is_pure_and_deterministic(tmp_path: Path) -> None:
    problem = Problem(16384, "bfloat16")
    first = render_export(CLUSTER, problem, metrics={"median_us": 3.0})
    again = render_export(CLUSTER, problem, metrics={"median_us": 3.0})
    assert first.files == again.files
    assert not list(tmp_path.iterdir())
    paths = export.write_export(first, tmp_path)
    assert [p.name for p in paths] == [
        "autonorm_ln_bf16_h16384.cu", "autonorm_ln_bf16_h16384.h", "autonorm_ln_bf16_h16384.json"
    ]
    assert {p.name: p.read_text() for p in paths} == first.files


def test_source_holds_the_rendered_kernel_verbatim_after_its_header() -> None:
    problem = Problem(4096, "float16")
    config = default_config(problem)
    exported = render_export(config, problem, basename="my_ln")
    kernel = render(config, problem)
    assert kernel.source in exported.source
    assert exported.source.index('#include "my_ln.h"') < exported.source.index(kernel.source)
    assert f"{kernel.name}<<<" in exported.source
    assert "#ifndef MY_LN_H_" in exported.header and "#endif  // MY_LN_H_" in exported.header


@pytest.mark.parametrize(
    ("weight", "bias"), [(True, True), (True, False), (False, True), (False, False)]
)
def test_weight_and_bias_parameters_exist_only_for_the_problem(weight: bool, bias: bool) -> None:
    problem = Problem(4096, "bfloat16", weight, bias)
    exported = render_export(default_config(problem), problem)
    decl = exported.header[exported.header.index("cudaError_t autonorm_ln"):]
    decl = decl[: decl.index(";")]
    elem = f"{default_basename(problem)}_elem"  # __nv_bfloat16 in C++, its raw struct in C
    assert (f"const {elem}* weight" in decl) == weight
    assert (f"const {elem}* bias" in decl) == bias
    assert f"const {elem}* x" in decl and f"{elem}* y, int rows, float eps" in decl
    assert "cudaStream_t stream" in decl


@pytest.mark.parametrize(
    ("dtype", "ctype", "include"),
    [("float32", "float", None), ("float16", "__half", "cuda_fp16.h"),
     ("bfloat16", "__nv_bfloat16", "cuda_bf16.h")],
)
def test_header_includes_what_its_type_needs(dtype: str, ctype: str, include: str | None) -> None:
    problem = Problem(4096, dtype)
    header = render_export(default_config(problem), problem).header
    assert "#include <cuda_runtime.h>" in header
    assert f"typedef {ctype} {default_basename(problem)}_elem;" in header
    for other in ("cuda_fp16.h", "cuda_bf16.h"):
        assert (f"#include <{other}>" in header) == (other == include)
    assert code_version() in header
    assert default_config(problem).label() in header
    assert f"rows of {problem.hidden} elements" in header


def test_launch_plan_features_appear_only_where_needed() -> None:
    problem = Problem(16384, "bfloat16")
    plain = render_export(default_config(problem), problem).source
    persistent = render_export(PERSISTENT, problem).source
    cluster = render_export(CLUSTER, problem).source
    big_problem = Problem(65536, "float16")
    assert smem_bytes(BIG_SMEM, big_problem) > 48 * 1024
    big = render_export(BIG_SMEM, big_problem).source
    assert "cudaDevAttrMultiProcessorCount" in persistent
    assert "cudaDevAttrMultiProcessorCount" not in plain + cluster + big
    assert "cudaFuncAttributeMaxDynamicSharedMemorySize" in big
    assert "cudaFuncAttributeMaxDynamicSharedMemorySize" not in plain + persistent + cluster
    assert "__cluster_dims__(2, 1, 1)" in cluster and "__cluster_dims__" not in plain
    assert f"kSmemBytes = {smem_bytes(BIG_SMEM, big_problem)};" in big
    assert "cudaOccupancy" not in plain + persistent + cluster + big
    assert "resident_clusters" not in plain + persistent + cluster + big


@pytest.mark.parametrize(("config", "problem"), [(None, Problem(16384, "bfloat16")),
                                                 (BULK, BULK_PROBLEM)])
def test_the_workspace_launcher_passes_a_tile_counter_to_bulk_kernels_only(
    config: KernelConfig | None, problem: Problem
) -> None:
    exported = render_export(config or default_config(problem), problem)
    bulk = exported.kernel.config.cache == "bulk"
    name, macro = default_basename(problem), default_basename(problem).upper()
    assert f"#define {macro}_WORKSPACE_BYTES {8 if bulk else 0}\n" in exported.header
    assert f"cudaError_t {name}_forward_ws(" in exported.header
    assert "unsigned int* workspace, cudaStream_t stream);" in exported.header
    source = exported.source
    launch = source[source.index(f"{exported.kernel.name}<<<"):]
    launch = launch[:launch.index(";")]
    assert launch.endswith("counter)" if bulk else "nullptr)"), launch
    if bulk:  # the counter only where the dynamic schedule pays, as LaunchPlan.uses_counter
        rule = f"unsigned int* counter = tiles >= {DYNAMIC_MIN_TILES}LL * clusters ? workspace"
        assert rule in source
    # The plain launcher is the workspace one without a workspace: one launch path.
    assert source.count(f"{exported.kernel.name}<<<") == 1
    assert f"return {name}_forward_ws(x, weight, bias, y, rows, eps, nullptr, stream);" in source
    assert "reinterpret_cast<std::uintptr_t>(workspace) & 3u" in source
    assert exported.manifest["workspace_bytes"] == (8 if bulk else 0)
    assert exported.manifest["function_with_workspace"] == f"{name}_forward_ws"


def _forward_body(source: str) -> str:
    return source[source.index('extern "C" cudaError_t'):]


@pytest.mark.parametrize(("config", "problem"), BULK_CASES)
def test_bulk_launcher_sizes_its_grid_by_the_occupancy_api(
    config: KernelConfig, problem: Problem
) -> None:
    exported = render_export(config, problem)
    plan = exported.kernel.launch
    assert plan.resident and plan.blocks_per_sm >= 1
    assert smem_bytes(config, problem) > 48 * 1024
    source = exported.source
    if config.cluster > 1:
        assert "cudaOccupancyMaxActiveClusters(&resident, " in source
        assert "cudaLaunchConfig_t config" in source
        assert "config.gridDim = dim3(kCluster, 1, 1);" in source
        assert "config.dynamicSmemBytes = kSmemBytes;" in source
        assert "cudaOccupancyMaxActiveBlocksPerMultiprocessor" not in source
    else:
        assert (
            "cudaOccupancyMaxActiveBlocksPerMultiprocessor(\n"
            f"      &per_sm, {exported.kernel.name}, kThreads, kSmemBytes);"
        ) in source
        assert "cudaOccupancyMaxActiveClusters" not in source
        assert "resident = per_sm * sms;" in source
    # The fallback of LaunchPlan.grid, the constants it uses, and the per-device cache.
    assert "resident = sms * kBlocksPerSm / kCluster;" in source
    assert f"constexpr int kBlocksPerSm = {plan.blocks_per_sm};" in source
    assert f"constexpr int kCluster = {plan.cluster};" in source
    assert "static std::atomic<int> cached[kCachedDevices];  // 0: not asked yet" in source
    # In the launcher: opt in to the shared memory first, then ask, then cap the tiles.
    body = _forward_body(source)
    opt_in = body.index("err = opt_in_smem(device);")
    query = body.index("err = resident_clusters(device, &resident);")
    cap = body.index("if (clusters > resident) clusters = resident;")
    launch = body.index(f"{exported.kernel.name}<<<")
    assert opt_in < query < cap < body.index("const long long grid = clusters * kCluster;") < launch
    assert "kBlocksPerSm / kCluster" not in body  # the persistent rule of other kernels
    # Header, grid rule and manifest say so.
    assert "occupancy API" in exported.header
    assert "Needs compute capability 9.0" in exported.header
    assert "occupancy API" in exported.manifest["launch"]["grid_rule"]
    launch_info = exported.manifest["launch"]
    assert launch_info["resident"] is True
    assert launch_info["min_compute_capability"] == 90
    assert LaunchPlan(**{k: launch_info[k] for k in (
        "threads", "smem_bytes", "cluster", "rows_per_block", "blocks_per_sm", "resident"
    )}) == plan


def test_invalid_config_and_basename_are_rejected() -> None:
    problem = Problem(4096, "bfloat16")
    with pytest.raises(ConfigError):
        render_export(KernelConfig(256, 8, 2, "registers", "welford", 2, 0), problem)
    for bad in ("1abc", "my-ln", "a b", ""):
        with pytest.raises(ValueError, match="C identifier"):
            render_export(default_config(problem), problem, basename=bad)


# -- manifest ---------------------------------------------------------------------------------


def test_manifest_round_trips_config_and_carries_metrics(tmp_path: Path) -> None:
    problem = Problem(16384, "bfloat16")
    metrics = {"median_us": np.float64(21.5), "gbps": 3121.0, "share": 0.91, "cv": float("nan")}
    paths = export_kernel(CLUSTER, problem, tmp_path, metrics=metrics)
    manifest = json.loads(paths[2].read_text())
    assert KernelConfig.from_dict(manifest["config"]) == CLUSTER
    assert Problem(**manifest["problem"]) == problem
    assert manifest["label"] == CLUSTER.label()
    assert manifest["kernel_name"] == render(CLUSTER, problem).name
    assert manifest["autonorm_version"] == code_version()
    assert manifest["function"] == "autonorm_ln_bf16_h16384_forward"
    assert manifest["metrics"] == {"median_us": 21.5, "gbps": 3121.0, "share": 0.91, "cv": None}
    assert manifest["source"] == "explicit"
    assert manifest["tuned_for"] is None and manifest["notes"] == []
    launch = manifest["launch"]
    plan = LaunchPlan(**{k: launch[k] for k in
                         ("threads", "smem_bytes", "cluster", "rows_per_block", "blocks_per_sm")})
    assert plan == render(CLUSTER, problem).launch
    assert launch["min_compute_capability"] == 90


def test_manifest_without_metrics_says_null(tmp_path: Path) -> None:
    problem = Problem(4096, "float32")
    paths = export_kernel(default_config(problem), problem, tmp_path / "new" / "dir")
    assert json.loads(paths[2].read_text())["metrics"] is None


# -- nvcc: compile, link, argument validation ---------------------------------------------------


@pytest.mark.parametrize(("config", "problem"), CASES + BULK_CASES)
def test_exported_source_compiles_with_plain_nvcc(
    tmp_path: Path, config: KernelConfig, problem: Problem
) -> None:
    nvcc = _nvcc()
    paths = export_kernel(config, problem, tmp_path)
    proc = _run(
        [nvcc, "-arch=sm_90", "-std=c++17", "-shared", "-Xcompiler", "-fPIC,-Wall,-Wextra",
         paths[0].name, "-o", "libexported.so"],
        tmp_path,
    )
    assert "warning" not in (proc.stdout + proc.stderr).lower(), proc.stderr
    assert_exports_only_its_functions(tmp_path / "libexported.so", paths[0].stem)


def assert_exports_only_its_functions(lib: Path, basename: str) -> None:
    """Check that a shared library built from an export shares no launcher state.

    Two exports of one basename (two configurations of one shape, in two plugins) may load into
    one process. Only their C functions may be dynamic symbols: a launcher's cached device
    answers shared through a unique symbol made the second use the first's, skipping its own
    shared-memory opt-in.
    """
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) not found")
    listed = subprocess.run([nm, "-D", "--defined-only", str(lib)], capture_output=True,
                            text=True, check=True).stdout.split("\n")
    symbols = [line.split()[1:] for line in listed if line.strip()]
    unique = [name for kind, name in symbols if kind == "u"]
    assert not unique, unique
    ours = sorted(name for kind, name in symbols if kind == "T" and basename in name)
    assert ours and all(name.startswith(f"{basename}_") for name in ours), ours
    assert not [name for _, name in symbols if "_detail" in name]


# One bulk kernel here (the cluster one): compiling both is test_exported_source_compiles_...'s job.
@pytest.mark.parametrize(("config", "problem"), CASES + BULK_CASES[1:])
def test_driver_links_against_export_and_validates_arguments(
    tmp_path: Path, config: KernelConfig, problem: Problem
) -> None:
    """A C++ caller includes the header and links; its `validate` mode makes no device call."""
    nvcc = _nvcc()
    paths = export_kernel(config, problem, tmp_path)
    basename = default_basename(problem)
    _run(
        [nvcc, "-arch=sm_90", "-std=c++17", "-I", str(tmp_path), *_driver_defines(basename),
         "-o", "prog", str(DRIVER), paths[0].name],
        tmp_path,
    )
    proc = subprocess.run(
        [str(tmp_path / "prog"), "validate"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr


def _host_compilers() -> tuple[str, str, Path]:
    """g++, gcc and the folder of the CUDA headers, for compiling a header without nvcc."""
    nvcc = _nvcc()
    gxx, gcc = shutil.which("g++"), shutil.which("gcc")
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"),
             str(Path(nvcc).resolve().parent.parent), "/usr/local/cuda"]
    include = next((Path(r) / "include" for r in roots
                    if r and (Path(r) / "include" / "cuda_runtime.h").is_file()), None)
    if gxx is None or gcc is None or include is None:
        pytest.skip("needs g++, gcc and the CUDA headers (CUDA_HOME, or next to nvcc)")
    return gxx, gcc, include


def test_header_compiles_with_a_plain_host_compiler(tmp_path: Path) -> None:
    gxx, gcc, include = _host_compilers()
    for dtype in ("bfloat16", "float16", "float32"):
        problem = Problem(16384, dtype)
        export_kernel(default_config(problem), problem, tmp_path)
        for name in ("use.cpp", "use.c"):
            (tmp_path / name).write_text(f'#include "{default_basename(problem)}.h"\n')
        _run([gxx, "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-I", str(include),
              "use.cpp"], tmp_path)
        # C has no __nv_bfloat16 or __half: the header declares CUDA's two-byte structs there.
        _run([gcc, "-std=c11", "-fsyntax-only", "-Wall", "-Wextra", "-I", str(include),
              "use.c"], tmp_path)


# -- export_from_db ---------------------------------------------------------------------------


@pytest.fixture
def user_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "user.db"
    monkeypatch.setenv("AUTONORM_DB", str(path))
    monkeypatch.setenv("AUTONORM_NO_SHIPPED_DB", "1")
    monkeypatch.delenv("AUTONORM_SHIPPED_DB", raising=False)
    return path


def _key(device: DeviceInfo = H200, bucket: int = 1024, **changes: object) -> TuningKey:
    fields = {"hidden": 16384, "dtype": "bfloat16", "has_weight": True, "has_bias": True,
              **changes}
    return TuningKey.for_problem(device.fingerprint, Problem(**fields), bucket)


# The kernel digest of a winner timed on code that no longer renders its configuration's kernel.
STALE = "0" * 64


def _add_winner(path: Path, key: TuningKey, config: KernelConfig, median_us: float = 20.0,
                device: DeviceInfo | None = H200, kernel: str | None = None) -> None:
    if kernel is None:
        limits = (device or H200).limits()
        problem = registry.get(key.op).problem(**key.fields)
        kernel = STALE if check(config, problem, limits) else lookup.kernel_of(
            config, problem, limits)
    with TuningDB(path) as db:
        if device is not None:
            db.record_device(device)
        db.set_winner(key, config.to_dict(), {"median_us": median_us, "gbps": 3000.0,
                                              "share": 0.9, "rows": key.rows_bucket}, kernel)


def _manifest(paths: list[Path]) -> dict:
    return json.loads(next(p for p in paths if p.suffix == ".json").read_text())


def test_export_from_db_uses_the_tuned_winner(user_db: Path, tmp_path: Path) -> None:
    _add_winner(user_db, _key(bucket=1024), CLUSTER, median_us=12.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DefaultConfigWarning)
        paths = export_from_db(16384, "bf16", tmp_path / "out")
    manifest = _manifest(paths)
    assert KernelConfig.from_dict(manifest["config"]) == CLUSTER
    assert manifest["source"] == "user"
    assert manifest["metrics"]["median_us"] == 12.5
    assert manifest["tuned_for"]["device"] == H200.fingerprint
    assert manifest["tuned_for"]["rows_bucket"] == 1024
    assert render(CLUSTER, Problem(16384, "bfloat16")).source in paths[0].read_text()


def test_export_from_db_picks_exact_bucket_or_else_the_largest(
    user_db: Path, tmp_path: Path
) -> None:
    _add_winner(user_db, _key(bucket=256), PERSISTENT)
    _add_winner(user_db, _key(bucket=4096), CLUSTER)
    assert _manifest(export_from_db(16384, "bfloat16", tmp_path / "a"))["config"] == (
        CLUSTER.to_dict()
    )
    exact = _manifest(export_from_db(16384, "bfloat16", tmp_path / "b", rows=200))
    assert exact["config"] == PERSISTENT.to_dict() and exact["source"] == "user"
    near = _manifest(export_from_db(16384, "bfloat16", tmp_path / "c", rows=1500))
    assert near["config"] == CLUSTER.to_dict() and near["source"] == "user-nearest"


def test_export_from_db_matches_problem_flags_and_kernel(user_db: Path, tmp_path: Path) -> None:
    _add_winner(user_db, _key(has_bias=False), PERSISTENT)
    _add_winner(user_db, _key(bucket=4096), PERSISTENT, kernel=STALE)  # larger, but stale
    _add_winner(user_db, _key(), CLUSTER)
    assert _manifest(export_from_db(16384, "bfloat16", tmp_path / "a"))["config"] == (
        CLUSTER.to_dict()
    )
    nobias = _manifest(export_from_db(16384, "bfloat16", tmp_path / "b", has_bias=False))
    assert nobias["config"] == PERSISTENT.to_dict()
    assert nobias["basename"] == "autonorm_ln_bf16_h16384_nobias"


def test_export_from_db_device_choice(
    user_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stamps = iter(["2026-11-01T00:00:00+00:00", "2026-11-02T00:00:00+00:00"] * 4)
    monkeypatch.setattr("autonorm.store.records.utc_now", lambda: next(stamps))
    a100_config = KernelConfig(512, 8, 1, "registers", "two_pass", 1, 0)
    _add_winner(user_db, _key(H200), CLUSTER)
    _add_winner(user_db, _key(A100), a100_config, device=A100)  # tuned last: the most recent
    latest = _manifest(export_from_db(16384, "bfloat16", tmp_path / "a"))
    assert latest["config"] == a100_config.to_dict()
    assert latest["tuned_for"]["device"] == A100.fingerprint
    assert latest["device_limits"]["cc"] == 80
    chosen = _manifest(export_from_db(16384, "bfloat16", tmp_path / "b",
                                      device_fingerprint=H200.fingerprint))
    assert chosen["config"] == CLUSTER.to_dict()


def test_export_from_db_prefers_user_then_shipped(
    user_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shipped = tmp_path / "shipped.db"
    _add_winner(shipped, _key(hidden=4096), PERSISTENT)
    _add_winner(shipped, _key(hidden=16384), PERSISTENT)
    _add_winner(user_db, _key(hidden=16384), CLUSTER)
    monkeypatch.delenv("AUTONORM_NO_SHIPPED_DB")
    monkeypatch.setenv("AUTONORM_SHIPPED_DB", str(shipped))
    user = _manifest(export_from_db(16384, "bfloat16", tmp_path / "a"))
    assert user["source"] == "user" and user["config"] == CLUSTER.to_dict()
    only_shipped = _manifest(export_from_db(4096, "bfloat16", tmp_path / "b"))
    assert only_shipped["source"] == "shipped"
    assert only_shipped["config"] == PERSISTENT.to_dict()


def test_export_from_db_falls_back_to_default_and_says_so(user_db: Path, tmp_path: Path) -> None:
    _add_winner(user_db, _key(), CLUSTER, kernel=STALE)  # stale: ignored
    with pytest.warns(DefaultConfigWarning, match="nothing is tuned"):
        paths = export_from_db(16384, "bfloat16", tmp_path / "out")
    manifest = _manifest(paths)
    problem = Problem(16384, "bfloat16")
    assert manifest["source"] == "default"
    assert KernelConfig.from_dict(manifest["config"]) == default_config(problem)
    assert manifest["metrics"] is None and manifest["tuned_for"] is None
    levels = {note["level"]: note["message"] for note in manifest["notes"]}
    assert "untuned default configuration" in levels["warning"]
    assert "other autonorm versions" in levels["info"]
    assert [p.name for p in paths] == [
        "autonorm_ln_bf16_h16384.cu", "autonorm_ln_bf16_h16384.h", "autonorm_ln_bf16_h16384.json"
    ]


def test_export_from_db_skips_a_winner_invalid_on_its_device(
    user_db: Path, tmp_path: Path
) -> None:
    # 131 KB of shared memory: too much for a device that allows 100 KB.
    small = DeviceInfo("Small GPU", 90, 100, 1 << 25, 100_000, 4096, 1_000_000)
    _add_winner(user_db, _key(small, dtype="float16", hidden=65536), BIG_SMEM, device=small)
    with pytest.warns(DefaultConfigWarning):
        manifest = _manifest(export_from_db(65536, "fp16", tmp_path / "out"))
    assert manifest["source"] == "default"


# -- a family without export hooks ------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PlainProblem(Problem):
    """A LayerNorm problem of a family registered under another op, with no export hooks."""

    op: ClassVar[str] = "plain_layer_norm"


class PlainFamily:
    """LayerNorm's family under another op, without its launcher (a family with no hooks)."""

    op = PlainProblem.op

    def problem(self, **fields: object) -> PlainProblem:
        return PlainProblem(**fields)

    def __getattr__(self, name: str) -> object:
        if name.startswith("export_") or name == "legacy_versions":
            raise AttributeError(name)
        return getattr(registry.get("layer_norm"), name)


@pytest.fixture
def plain_family():
    family = registry.register(PlainFamily())
    yield family
    registry.unregister(family.op)


def test_a_family_without_hooks_exports_its_kernel_and_a_manifest(
    plain_family: PlainFamily, tmp_path: Path
) -> None:
    problem = PlainProblem(4096, "float16", True, False)
    config = default_config(problem)
    exported = render_export(config, problem, metrics={"median_us": 2.0})
    kernel = render(config, problem)
    assert exported.basename == "autonorm_plain_layer_norm_fp16_h4096"
    assert list(exported.files) == [f"{exported.basename}.cu", f"{exported.basename}.json"]
    assert exported.source == kernel.source and exported.header is None
    manifest = exported.manifest
    assert manifest["files"] == {"source": f"{exported.basename}.cu"}
    assert manifest["launch"] == dataclasses.asdict(kernel.launch)
    assert manifest["problem"] == problem.fields() and manifest["config"] == config.to_dict()
    assert manifest["kernel_name"] == kernel.name and manifest["metrics"] == {"median_us": 2.0}
    assert "function" not in manifest and "workspace_bytes" not in manifest
    paths = export.write_export(exported, tmp_path)
    assert [p.name for p in paths] == list(exported.files)


def test_export_from_db_serves_any_registered_family(
    plain_family: PlainFamily, user_db: Path, tmp_path: Path
) -> None:
    problem = PlainProblem(16384, "bfloat16")
    key = TuningKey.for_problem(H200.fingerprint, problem, 4096)
    _add_winner(user_db, key, CLUSTER)
    _add_winner(user_db, _key(bucket=4096), PERSISTENT)  # LayerNorm's: another op
    paths = export_from_db(16384, "bf16", tmp_path / "out", op=plain_family.op, rows=1000)
    assert [p.suffix for p in paths] == [".cu", ".json"]
    manifest = _manifest(paths)
    assert manifest["config"] == CLUSTER.to_dict()
    assert manifest["source"] == "user-nearest"
    messages = [note["message"] for note in manifest["notes"]]
    assert any("nearest tuned bucket, 4096" in m for m in messages), messages
    assert paths[0].read_text() == render(CLUSTER, problem).source
    with pytest.raises(KeyError, match="unknown op"):
        export_from_db(16384, "bf16", tmp_path / "none", op="no_such_op")


# -- GPU: the exported kernel equals the in-process one, bit for bit -------------------------


GPU_BF16 = Problem(16384, "bfloat16")


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("config", "problem"),
    [
        pytest.param(None, GPU_BF16, id="bf16-default"),
        pytest.param(CLUSTER, GPU_BF16, id="bf16-cluster"),
        pytest.param(PERSISTENT, GPU_BF16, id="bf16-persistent"),
        pytest.param(BIG_SMEM, Problem(65536, "float16"), id="fp16-big-smem"),
        pytest.param(BULK, BULK_PROBLEM, id="bf16-bulk"),
        pytest.param(BULK_CLUSTER, BULK_CLUSTER_PROBLEM, id="bf16-bulk-cluster"),
    ],
)
def test_exported_kernel_matches_in_process_kernel_bitwise(
    tmp_path: Path, config: KernelConfig | None, problem: Problem
) -> None:
    cupy = pytest.importorskip("cupy")
    nvcc = _nvcc()
    from autonorm.runtime.device import query_device

    info = query_device()
    limits = info.limits()
    config = config or default_config(problem, limits)
    if check(config, problem, limits):
        pytest.skip(f"{config.label()} cannot run on {info.name}")
    kernel = compiler.compile_kernel(render(config, problem, limits))
    plan = kernel.plan
    rows, eps = 300, 1e-5
    if config.cache == "bulk":
        # Tiles enough a cluster for the dynamic schedule (LaunchPlan.uses_counter), and a
        # ragged last tile: the workspace path below is then the one that claims tiles.
        clusters = kernel.grid(1 << 30) // plan.cluster
        rows = DYNAMIC_MIN_TILES * clusters * plan.rows_per_block + 3
        assert plan.uses_counter(rows, kernel.grid(rows))

    paths = export_kernel(config, problem, tmp_path, device=limits)
    basename = default_basename(problem)
    lib = tmp_path / "libexport.so"
    _run(
        [nvcc, f"-arch={info.arch}", "-std=c++17", "-shared", "-Xcompiler", "-fPIC",
         "-DEXPORT_DRIVER_NO_MAIN", "-I", str(tmp_path), *_driver_defines(basename),
         "-o", str(lib), str(DRIVER), paths[0].name],
        tmp_path,
    )
    so = ctypes.CDLL(str(lib))
    forward = so.export_driver_forward
    forward.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int, ctypes.c_float, ctypes.c_void_p]
    forward.restype = ctypes.c_int

    rng = np.random.default_rng(0)
    x = cupy.asarray(_bits(rng.normal(3.0, 2.0, (rows, problem.hidden)), problem.dtype))
    w = cupy.asarray(_bits(rng.normal(1.0, 0.5, problem.hidden), problem.dtype))
    b = cupy.asarray(_bits(rng.normal(0.0, 0.5, problem.hidden), problem.dtype))
    # Poisoned with 0xFFFF (NaN in bf16 and fp16), so an unwritten element shows.
    y_exported = cupy.full((rows, problem.hidden), 0xFFFF, dtype=cupy.uint16)
    y_in_process = cupy.full((rows, problem.hidden), 0xFFFF, dtype=cupy.uint16)

    err = forward(x.data.ptr, w.data.ptr, b.data.ptr, y_exported.data.ptr, rows, eps, None)
    assert err == 0, f"exported launcher returned cudaError {err}"
    cupy.cuda.runtime.deviceSynchronize()

    kernel.launch((x.data.ptr, w.data.ptr, b.data.ptr, y_in_process.data.ptr, rows, eps))
    cupy.cuda.runtime.deviceSynchronize()

    assert not bool((y_in_process == 0xFFFF).any()), "in-process kernel left rows unwritten"
    assert bool(cupy.array_equal(y_exported, y_in_process)), "outputs differ"

    # With a workspace (the bulk kernel's tile counter; other kernels ignore it): the same bits
    # twice in a row, the kernel leaving the workspace zeroed after each launch.
    bulk = config.cache == "bulk"
    assert so.export_driver_workspace_bytes() == (8 if bulk else 0)
    forward_ws = so.export_driver_forward_ws
    forward_ws.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int, ctypes.c_float] + [
        ctypes.c_void_p] * 2
    forward_ws.restype = ctypes.c_int
    workspace = cupy.zeros(2, dtype=cupy.uint32)
    for _ in range(2):
        y_ws = cupy.full((rows, problem.hidden), 0xFFFF, dtype=cupy.uint16)
        assert forward_ws(x.data.ptr, w.data.ptr, b.data.ptr, y_ws.data.ptr, rows, eps,
                          workspace.data.ptr, None) == 0
        cupy.cuda.runtime.deviceSynchronize()
        assert bool(cupy.array_equal(y_ws, y_in_process)), "outputs differ with a workspace"
        assert workspace.get().tolist() == [0, 0]
    # The kernel does read it: a workspace left with 5 tiles claimed skips five of the tiles
    # handed out dynamically (those beyond every cluster's first `stages`).
    if bulk:
        workspace[0] = 5
        y_ws = cupy.full((rows, problem.hidden), 0xFFFF, dtype=cupy.uint16)
        assert forward_ws(x.data.ptr, w.data.ptr, b.data.ptr, y_ws.data.ptr, rows, eps,
                          workspace.data.ptr, None) == 0
        cupy.cuda.runtime.deviceSynchronize()
        assert bool((y_ws == 0xFFFF).all(axis=1).any()), "a dirty workspace skipped no tile"
        assert workspace.get().tolist() == [0, 0]
        # With fewer tiles a cluster than the dynamic schedule needs, the launcher leaves the
        # workspace alone (it would skip five tiles if read) and takes the static schedule.
        few = (DYNAMIC_MIN_TILES - 1) * (kernel.grid(1 << 30) // plan.cluster) * plan.rows_per_block
        assert not plan.uses_counter(few, kernel.grid(few))
        workspace[0] = 5
        y_few = cupy.full((few, problem.hidden), 0xFFFF, dtype=cupy.uint16)
        assert forward_ws(x.data.ptr, w.data.ptr, b.data.ptr, y_few.data.ptr, few, eps,
                          workspace.data.ptr, None) == 0
        cupy.cuda.runtime.deviceSynchronize()
        assert bool(cupy.array_equal(y_few, y_in_process[:few])), "few tiles: outputs differ"
        assert workspace.get().tolist() == [5, 0]

    # Validation on a real device: a misaligned pointer and rows < 0 launch nothing.
    invalid = 1  # cudaErrorInvalidValue
    assert forward(x.data.ptr + 2, w.data.ptr, b.data.ptr, y_exported.data.ptr, rows, eps,
                   None) == invalid
    assert forward(x.data.ptr, w.data.ptr, b.data.ptr, y_exported.data.ptr, -1, eps,
                   None) == invalid
    assert forward(x.data.ptr, w.data.ptr, b.data.ptr, y_exported.data.ptr, 0, eps, None) == 0
