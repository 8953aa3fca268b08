"""CPU: the launch ABI, a compiled kernel's launch paths and the GPU evaluator's family seam.

No GPU: the driver's ``cuLaunchKernel`` and CuPy's ``Function`` are stand-ins that record what
they are given, read back the way the driver reads it (one pointer per kernel parameter). The
evaluator runs a made-up family whose workload records its launches, so nothing here names
LayerNorm except the tests of LayerNorm's own parameter list.
"""

from __future__ import annotations

import ctypes
import dataclasses
import subprocess
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pytest

from autonorm.errors import ConfigError, LaunchError
from autonorm.ops import registry
from autonorm.ops.layer_norm.codegen import render
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.family import FAMILY
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.space import default_config
from autonorm.results import Timing
from autonorm.runtime import compiler, driver, workspace
from autonorm.runtime import timing as bench
from autonorm.runtime.abi import DEFAULT_ABI, KernelABI
from autonorm.tune.evaluator import GpuEvaluator

SM_COUNT = 132

# --------------------------------------------------------------------------- the ABI


def test_the_default_abi_is_the_packed_layout_of_seven_values() -> None:
    assert DEFAULT_ABI.packer.format == "=QQQQifQ"
    assert DEFAULT_ABI.packer.size == 48
    assert DEFAULT_ABI.offsets == (0, 8, 16, 24, 32, 36, 40)
    assert DEFAULT_ABI.count == 6
    assert DEFAULT_ABI.numpy_types == (
        "uint64", "uint64", "uint64", "uint64", "int32", "float32", "uint64",
    )


def test_layer_norm_states_its_parameter_list() -> None:
    problem = Problem(4096, "bfloat16")
    kernel = render(default_config(problem), problem)
    abi = FAMILY.kernel_abi(kernel)
    assert (abi.params, abi.rows_index, abi.workspace) == ("QQQQif", 4, True)
    assert abi.packer.format == DEFAULT_ABI.packer.format and abi.offsets == DEFAULT_ABI.offsets
    # the kernel's signature, in the rendered source, takes exactly these, in this order
    signature = kernel.source.split(kernel.name + "(", 1)[1].split(")", 1)[0]
    assert signature.count(",") == abi.count  # seven parameters: six values and the counter


def test_values_sit_at_their_natural_alignment() -> None:
    abi = KernelABI("QiQf", rows_index=1)
    assert abi.offsets == (0, 8, 16, 24)  # the int padded to 8 bytes before the pointer
    assert abi.packer.size == 40  # the workspace slot always ends the buffer, read or not
    packed = abi.packer.pack(1, 2, 3, 4.0, 0)
    assert int.from_bytes(packed[8:12], "little") == 2
    assert int.from_bytes(packed[16:24], "little") == 3
    with_workspace = KernelABI("if", rows_index=0, workspace=True)
    assert with_workspace.offsets == (0, 4, 8)
    assert with_workspace.numpy_types == ("int32", "float32", "uint64")


@pytest.mark.parametrize(
    ("params", "rows_index", "match"),
    [("", 0, "codes"), ("QZ", 0, "codes"), ("Qi", 2, "rows_index"), ("Qf", 1, "integer")],
)
def test_a_bad_parameter_list_is_refused(params: str, rows_index: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        KernelABI(params, rows_index=rows_index)


# --------------------------------------------------------------------------- launching


class FakeDriver:
    """``cuLaunchKernel`` that decodes its parameter buffer with the given codes."""

    def __init__(self, codes: str, result: int = 0) -> None:
        self.codes = codes
        self.result = result
        self.calls: list[dict[str, Any]] = []

    def __call__(self, fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra):  # noqa: ANN001
        ptrs = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        kinds = {"Q": ctypes.c_uint64, "i": ctypes.c_int32, "f": ctypes.c_float}
        values = [kinds[c].from_address(ptrs[i]).value for i, c in enumerate(self.codes)]
        self.calls.append({"grid": (gx, gy, gz), "block": (bx, by, bz), "smem": smem,
                           "stream": stream.value, "values": values})
        return self.result


class FakeFunction:
    """CuPy's ``Function``: a handle, and a call that records CuPy's launch."""

    ptr = 0xF00D

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, grid, block, args, smem, stream) -> None:  # noqa: ANN001
        self.calls.append((grid, block, args, smem, stream))


@pytest.fixture
def fake_driver(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """Install a recording cuLaunchKernel; the test sets its codes and result."""
    fake = FakeDriver("QQQQifQ")
    monkeypatch.setattr(driver._DriverLauncher, "_lib", staticmethod(fake))  # noqa: SLF001
    monkeypatch.setattr(driver._DriverLauncher, "_lib_tried", True)  # noqa: SLF001
    monkeypatch.setattr(driver._DriverLauncher, "_cuda", None)  # noqa: SLF001 - no occupancy
    return fake


def compiled(config: KernelConfig, problem: Problem, abi: KernelABI = DEFAULT_ABI) -> Any:
    return compiler.CompiledKernel(render(config, problem), FakeFunction(), SM_COUNT, abi=abi)


ROW = KernelConfig(256, 8, 1, "registers", "two_pass", 1, 0)
BULK = KernelConfig(512, 8, 1, "bulk", "two_pass", 1, 0, 2)
PTRS = (0x7F00_0000_0000, 0x7F00_0010_0000, 0, 0x7FFF_FFFF_FFF0)


def test_a_row_kernel_launch_packs_the_values_and_no_counter(fake_driver: FakeDriver) -> None:
    kernel = compiled(ROW, Problem(4096, "bfloat16"))
    assert kernel._driver is not None  # noqa: SLF001
    kernel.launch((*PTRS, 70001, 1e-5), 0x5555_0000)
    (call,) = fake_driver.calls
    assert call["grid"] == (kernel.grid(70001), 1, 1)
    assert call["block"] == (256, 1, 1) and call["smem"] == kernel.plan.smem_bytes
    assert call["stream"] == 0x5555_0000
    assert call["values"][:5] == [*PTRS, 70001]
    assert call["values"][5] == pytest.approx(1e-5, rel=1e-7)
    assert call["values"][6] == 0  # a row kernel never takes the dynamic schedule
    kernel.launch((*PTRS, 0, 1e-5), 0x5555_0000)
    assert len(fake_driver.calls) == 1  # no rows, no launch


def test_a_bulk_kernel_takes_the_streams_counter_where_it_pays(
    fake_driver: FakeDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = []
    monkeypatch.setattr(
        workspace, "counter_for", lambda device, stream: asked.append((device, stream)) or 0xC0
    )
    kernel = compiled(BULK, Problem(16384, "bfloat16"))
    rows = 100_000
    assert kernel.plan.uses_counter(rows, kernel.grid(rows))
    kernel.launch((*PTRS, rows, 1e-5), 0x77)
    assert asked == [(0, 0x77)] and fake_driver.calls[-1]["values"][6] == 0xC0
    kernel.launch((*PTRS, rows, 1e-5), 0x77, work_ptr=0x1230)  # the caller's own counter
    assert len(asked) == 1 and fake_driver.calls[-1]["values"][6] == 0x1230
    kernel.launch((*PTRS, 3, 1e-5), 0x77, work_ptr=0x1230)  # too few tiles: static schedule
    assert fake_driver.calls[-1]["values"][6] == 0


def test_a_kernel_without_a_workspace_gets_no_counter(
    fake_driver: FakeDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workspace, "counter_for", lambda *a: pytest.fail("asked for a counter"))
    fake_driver.codes = "QQi"
    abi = KernelABI("QQi", rows_index=2)
    kernel = compiled(BULK, Problem(16384, "bfloat16"), abi)
    assert kernel.plan.uses_counter(100_000, kernel.grid(100_000))
    kernel.launch((0x10, 0x20, 100_000), 0x99)
    assert fake_driver.calls[-1]["values"] == [0x10, 0x20, 100_000]
    kernel._driver = None  # noqa: SLF001 - CuPy's path: exactly the three values
    kernel.launch((0x10, 0x20, 100_000), None)
    (_, _, args, _, _) = kernel._function.calls[-1]  # noqa: SLF001
    assert [type(a) for a in args] == [np.uint64, np.uint64, np.int32]


def test_cupys_path_takes_typed_values(fake_driver: FakeDriver) -> None:
    kernel = compiled(ROW, Problem(4096, "bfloat16"))
    kernel.launch((*PTRS, 5, 1e-5))  # no stream: CuPy's current one, through CuPy's call
    assert not fake_driver.calls
    ((grid, block, args, smem, stream),) = kernel._function.calls  # noqa: SLF001
    assert grid == (kernel.grid(5), 1, 1) and block == (256, 1, 1) and stream is None
    assert smem == kernel.plan.smem_bytes
    assert [type(a) for a in args] == [np.uint64] * 4 + [np.int32, np.float32, np.uint64]
    assert [int(a) for a in args[:5]] == [*PTRS, 5] and int(args[6]) == 0


def test_a_context_error_falls_back_to_cupy_and_others_raise(
    fake_driver: FakeDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compiler, "wrap_stream", lambda ptr: ("stream", ptr))  # CuPy's wrapper
    kernel = compiled(ROW, Problem(4096, "bfloat16"))
    fake_driver.result = 201  # no current context on this thread
    kernel.launch((*PTRS, 5, 1e-5), 0x42)
    assert kernel._driver is None  # noqa: SLF001 - CuPy's path from now on
    ((_, _, args, _, stream),) = kernel._function.calls  # noqa: SLF001
    assert stream == ("stream", 0x42) and [int(a) for a in args[:5]] == [*PTRS, 5]
    other = compiled(ROW, Problem(4096, "bfloat16"))
    fake_driver.result = 700  # an illegal address: the launch failed
    with pytest.raises(LaunchError, match="CUresult 700"):
        other.launch((*PTRS, 5, 1e-5), 0)


class FakeAffinityDriver:
    """The driver library's ``cuCtxGetExecAffinity``: writes an SM count, returns ``code``."""

    def __init__(self, sms: int, code: int = 0) -> None:
        self.sms, self.code = sms, code

    def cuCtxGetExecAffinity(self, param: Any, kind: int) -> int:  # noqa: N802 - the C name
        assert kind == 0  # CU_EXEC_AFFINITY_TYPE_SM_COUNT
        param._obj.sm_count = self.sms  # noqa: SLF001 - ctypes.byref's referent
        return self.code


class FakeGreenDriver(FakeAffinityDriver):
    """Both calls: the MPS affinity, and the current context's SM resource (a green context)."""

    def __init__(self, sms: int, green: int, code: int = 0, context: int = 0x5000) -> None:
        super().__init__(sms)
        self.green, self.green_code, self.context = green, code, context

    def cuCtxGetCurrent(self, context: Any) -> int:  # noqa: N802 - the C name
        context._obj.value = self.context  # noqa: SLF001 - ctypes.byref's referent
        return 0

    def cuCtxGetDevResource(self, context: Any, resource: Any, kind: int) -> int:  # noqa: N802
        assert context.value == self.context and kind == 1  # CU_DEV_RESOURCE_TYPE_SM
        resource._obj.sm_count = self.green  # noqa: SLF001 - ctypes.byref's referent
        return self.green_code


@pytest.mark.parametrize(("lib", "expected"), [
    (FakeAffinityDriver(66), 66),  # an MPS client at half the SMs
    (FakeAffinityDriver(132), 132),
    (FakeAffinityDriver(66, code=801), None),  # not supported: the driver cannot say
    (FakeAffinityDriver(0), None),
    (FakeGreenDriver(132, 32), 32),  # a green context of 32 SMs
    (FakeGreenDriver(66, 132), 66),  # MPS within a whole context: the fewer
    (FakeGreenDriver(132, 32, code=801), 132),  # no resource answer: the affinity's
    (FakeGreenDriver(132, 32, context=0), 132),  # no current context to ask about
    (object(), None),  # a driver without the calls
    (None, None),  # no driver
])
def test_the_context_sm_count_is_the_drivers_or_unknown(monkeypatch, lib, expected) -> None:  # noqa: ANN001
    monkeypatch.setattr(driver, "driver_library", lambda: lib)
    assert driver.context_sm_count() == expected


def test_the_resource_struct_matches_the_cuda_header(tmp_path) -> None:  # noqa: ANN001
    # ctypes reads the SM count at the offset CUDA's own CUdevResource has it.
    from autonorm.runtime import offline

    nvcc = offline.nvcc_path()
    if nvcc is None:
        pytest.skip("nvcc not found on PATH: the CUDA header is needed")
    (tmp_path / "layout.cu").write_text(
        "#include <cuda.h>\n#include <cstddef>\n#include <cstdio>\n"
        "int main() { std::printf(\"%zu %zu\\n\", sizeof(CUdevResource), "
        "offsetof(CUdevResource, sm) + offsetof(CUdevSmResource, smCount)); }\n")
    subprocess.run([nvcc, "-o", str(tmp_path / "layout"), str(tmp_path / "layout.cu")],
                   check=True, capture_output=True)
    out = subprocess.run([str(tmp_path / "layout")], check=True, capture_output=True, text=True)
    size, offset = map(int, out.stdout.split())
    assert (size, offset) == (ctypes.sizeof(driver._DevResource),  # noqa: SLF001
                              driver._DevResource.sm_count.offset)  # noqa: SLF001


@pytest.mark.parametrize(("limit", "expected"), [(66, 66), (200, 132), (None, 132)])
def test_a_grid_barrier_counts_only_the_sms_its_context_may_use(monkeypatch, limit, expected) -> None:  # noqa: ANN001, E501
    # Under MPS a block past the client's SMs finds none free until the launch ends, which it
    # cannot while the resident blocks wait for it at the barrier: the grid must fit the SMs
    # the context has.
    monkeypatch.setattr(driver, "context_sm_count", lambda: limit)
    compiler.usable_sms.cache_clear()
    try:
        sms = compiler.usable_sms(0, SM_COUNT)
    finally:
        compiler.usable_sms.cache_clear()
    assert sms == expected
    plan = dataclasses.replace(render(BULK, Problem(16384, "bfloat16")).launch, barrier=True,
                               blocks_per_sm=2)
    assert plan.grid(10**6, sms) == 2 * expected


# --------------------------------------------------------------------------- the evaluator


@dataclass(frozen=True)
class ToyProblem:
    op: ClassVar[str] = "toy_evaluator"
    dtype: str = "float32"
    hidden: int = 256

    def fields(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "hidden": self.hidden}

    def describe(self) -> str:
        return f"toy {self.hidden}"


@dataclass(frozen=True)
class ToyConfig:
    threads: int

    def to_dict(self) -> dict[str, Any]:
        return {"threads": self.threads}

    def label(self) -> str:
        return f"t{self.threads}"


@dataclass
class ToyVerification:
    ok: bool
    max_rel_err: float = 1e-7

    def summary(self) -> str:
        return "ok" if self.ok else "case: wrong"


class ToyWorkload:
    nbytes = 1 << 20
    n_sets = 3

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.launched: list[tuple] = []
        self.verified: list[Any] = []

    def launch(self, kernel: Any, index: int, stream_ptr: int) -> None:
        self.launched.append((kernel, index, stream_ptr))

    def verify(self, kernel: Any) -> ToyVerification:
        self.verified.append(kernel)
        return ToyVerification(ok=kernel.rendered.config.threads != 13)


class ToyFamily:
    op = "toy_evaluator"
    abi = KernelABI("Qi", rows_index=1)

    def render(self, config: ToyConfig, problem: ToyProblem, device: Any) -> Any:
        if config.threads == 7:
            raise ConfigError("7 threads cannot run anything")
        return dataclasses.make_dataclass("Rendered", ["config", "problem"])(config, problem)

    def kernel_abi(self, kernel: Any) -> KernelABI:
        return self.abi

    def workload(self, problem: ToyProblem, rows: int, *, device_id: int, seed: int) -> Any:
        return ToyWorkload(rows)


def test_the_evaluator_reaches_a_family_only_through_the_seam(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from autonorm.runtime import device

    monkeypatch.setattr(device, "query_device", lambda device_id=None: device.DeviceInfo(
        "toy", 90, SM_COUNT, 50 << 20, 227 << 10, 5120, 2_619_000))
    monkeypatch.setattr(bench, "copy_bandwidth_gbps", lambda device_id=0: 4000.0)
    compiles = []

    def compile_kernel(rendered: Any, device_id: int, abi: KernelABI) -> Any:
        compiles.append((rendered.config, abi))
        return type("Kernel", (), {"rendered": rendered, "attributes": {}})()

    def time_launches(launch: Any, nbytes: int, n_sets: int, **kw: Any) -> Timing:
        for i in range(5):
            launch(i % n_sets, 0xAB)
        return Timing(median_us=nbytes / 4e3, p20_us=1, p80_us=1, cv=0.01, gbps=4000, share=1)

    monkeypatch.setattr(compiler, "compile_kernel", compile_kernel)
    monkeypatch.setattr(bench, "time_launches", time_launches)
    family = registry.register(ToyFamily())
    try:
        evaluator = GpuEvaluator(ToyProblem(), 64)
        assert evaluator.family is family and evaluator.nbytes == 1 << 20
        assert evaluator.n_sets == 3 and evaluator.workload.rows == 64
        good = evaluator.evaluate(ToyConfig(32))
        assert good.ok and good.max_rel_err == 1e-7, good
        assert compiles == [(ToyConfig(32), ToyFamily.abi)]
        kernel = evaluator.workload.verified[-1]
        assert evaluator.workload.launched == [(kernel, i % 3, 0xAB) for i in range(5)]
        wrong = evaluator.evaluate(ToyConfig(13))
        assert wrong.status == "verification" and wrong.error == "case: wrong"
        invalid = evaluator.evaluate(ToyConfig(7))
        assert invalid.status == "invalid" and "7 threads" in invalid.error
    finally:
        registry.unregister("toy_evaluator")
