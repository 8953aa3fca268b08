"""GPU: the bulk-copy kernel's dynamic tile schedule (a per-stream counter in global memory).

Each row's arithmetic does not depend on which block runs it, so the dynamic and the static
schedule must write the same bits; the counter must be zero again after every launch; a counter
left dirty must show (this is what makes the equality checks able to fail); every launch
captured into a CUDA graph gets a counter of its own, which its replays use and leave zeroed;
two streams running at once get one each.
"""

from __future__ import annotations

import pytest
from keep_x_cases import FWD_KEEP_CASES

from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.problem import Problem

pytestmark = pytest.mark.gpu

# (config, hidden, dtype): many more tiles than clusters, so most tiles are claimed dynamically.
CASES = [
    (KernelConfig(512, 8, 1, "bulk", "two_pass", 1, 0, 2), 16384, "bfloat16"),
    (KernelConfig(256, 8, 2, "bulk", "two_pass", 1, 0, 3), 4096, "float16"),
    (KernelConfig(512, 8, 1, "bulk", "two_pass", 2, 0, 2), 65536, "bfloat16"),
    (KernelConfig(512, 4, 1, "bulk", "two_pass", 4, 0, 2), 32768, "float32"),
    (KernelConfig(256, 8, 1, "bulk", "two_pass", 2, 0, 1), 8192, "bfloat16"),
]


def _setup(config: KernelConfig, hidden: int, dtype: str, rows_per_cluster: int = 9,  # noqa: ANN202
           rows: int = 0):
    import cupy
    import numpy as np

    from autonorm.numerics import from_float64
    from autonorm.ops import layer_norm as codegen
    from autonorm.runtime import compiler

    problem = Problem(hidden, dtype)
    kernel = compiler.compile_kernel(codegen.render(config, problem))
    if not rows:
        clusters = kernel.grid(1 << 30) // config.cluster
        rows = clusters * config.rows_per_block * rows_per_cluster + 3  # a ragged last round
    # Data made as the evaluator makes it: float64, rounded to the storage dtype.
    rng = np.random.default_rng(7)
    x = cupy.asarray(from_float64(rng.standard_normal((rows, hidden)) * 3 + 1, dtype))
    w = cupy.asarray(from_float64(1 + 0.1 * rng.standard_normal(hidden), dtype))
    b = cupy.asarray(from_float64(0.1 * rng.standard_normal(hidden), dtype))
    return kernel, x, w, b, rows


def _run(kernel, x, w, b, rows: int, work_ptr: int):  # noqa: ANN001, ANN202
    import cupy

    y = cupy.full(x.shape, 0x7FC1 if x.dtype == cupy.uint16 else float("nan"), dtype=x.dtype)
    stream = cupy.cuda.get_current_stream()
    kernel.launch((x.data.ptr, w.data.ptr, b.data.ptr, y.data.ptr, rows, 1e-5), stream.ptr,
                  work_ptr=work_ptr)
    stream.synchronize()
    return y


def _same_bits(a, b) -> bool:  # noqa: ANN001
    import cupy

    view = cupy.uint16 if a.dtype.itemsize == 2 else cupy.uint32
    return bool((a.view(view) == b.view(view)).all())


@pytest.mark.parametrize(("config", "hidden", "dtype"), CASES, ids=lambda v: str(v))
def test_dynamic_schedule_matches_static_and_resets(config, hidden, dtype) -> None:  # noqa: ANN001
    from autonorm.runtime import workspace

    kernel, x, w, b, rows = _setup(config, hidden, dtype)
    static = _run(kernel, x, w, b, rows, work_ptr=0)
    counter = workspace.new_counter(0)
    for _ in range(3):  # each launch leaves the counter zero for the next one
        dynamic = _run(kernel, x, w, b, rows, work_ptr=counter.data.ptr)
        assert counter.tolist() == [0, 0]
        assert _same_bits(dynamic, static), config.label()


@pytest.mark.parametrize(("config", "hidden", "dtype"), CASES[:3], ids=lambda v: str(v))
def test_a_dirty_counter_skips_tiles(config, hidden, dtype) -> None:  # noqa: ANN001
    from autonorm.runtime import workspace

    kernel, x, w, b, rows = _setup(config, hidden, dtype)
    static = _run(kernel, x, w, b, rows, work_ptr=0)
    counter = workspace.new_counter(0)
    counter[0] = 5  # as if an earlier launch had died mid-way: five tiles are never claimed
    dirty = _run(kernel, x, w, b, rows, work_ptr=counter.data.ptr)
    assert not _same_bits(dirty, static)
    assert counter.tolist() == [0, 0]  # and the launch still cleans up after itself
    assert _same_bits(_run(kernel, x, w, b, rows, work_ptr=counter.data.ptr), static)


@pytest.mark.parametrize(("config", "hidden", "dtype"), CASES[:3], ids=lambda v: str(v))
def test_few_tiles_a_cluster_take_the_static_schedule(config, hidden, dtype) -> None:  # noqa: ANN001
    from autonorm.codegen.kernel import DYNAMIC_MIN_TILES
    from autonorm.runtime import workspace

    # One tile a cluster fewer than the dynamic schedule needs (and a ragged last round).
    kernel, x, w, b, rows = _setup(config, hidden, dtype, rows_per_cluster=DYNAMIC_MIN_TILES - 1)
    static = _run(kernel, x, w, b, rows, work_ptr=0)
    counter = workspace.new_counter(0)
    counter[0] = 5  # would skip five tiles if the launch used it (test_a_dirty_counter_skips_tiles)
    assert _same_bits(_run(kernel, x, w, b, rows, work_ptr=counter.data.ptr), static)
    assert counter.tolist() == [5, 0]  # left alone


def _capture(kernel, x, w, b, ys, rows: int, stream, mode=None):  # noqa: ANN001, ANN202
    """A graph of one launch per output in ``ys``, captured on ``stream``, counters by default.

    ``mode``: the capture mode (CuPy's default is relaxed; PyTorch's is global).
    """
    with stream:
        stream.begin_capture(mode)
        for y in ys:
            kernel.launch((x.data.ptr, w.data.ptr, b.data.ptr, y.data.ptr, rows, 1e-5), stream.ptr)
        return stream.end_capture()


@pytest.mark.parametrize("mode", ["relaxed", "global"])
def test_captured_launches_get_counters_of_their_own_and_replays_are_right(monkeypatch, mode) -> None:  # noqa: ANN001, E501
    import cupy

    from autonorm.runtime import workspace

    config, hidden, dtype = CASES[0]
    kernel, x, w, b, rows = _setup(config, hidden, dtype)
    static = _run(kernel, x, w, b, rows, work_ptr=0)
    stream = cupy.cuda.Stream(non_blocking=True)
    own = workspace.counter_for(0, stream.ptr)
    # No page yet: the first captured launch makes one while the stream captures, in either
    # mode (global: any unsafe call from any thread would invalidate the capture).
    monkeypatch.setattr(workspace, "_OPEN_PAGE", {})
    ys = [cupy.zeros_like(x) for _ in range(2)]
    cupy.cuda.Device().synchronize()  # the zeroing ran on CuPy's stream, not on `stream`
    modes = {"relaxed": 2, "global": 0}  # cudaStreamCaptureModeRelaxed / Global
    graph = _capture(kernel, x, w, b, ys, rows, stream, modes[mode])
    base, taken = workspace._OPEN_PAGE[0]  # noqa: SLF001
    assert taken == 2 and own not in (base, base + workspace.COUNTER_BYTES)
    page = cupy.ndarray((2 * taken,), cupy.uint32, cupy.cuda.MemoryPointer(
        cupy.cuda.UnownedMemory(base, 8 * taken, workspace._PAGES[-1]), 0))  # noqa: SLF001
    for _ in range(3):
        graph.launch(stream)
    stream.synchronize()
    assert page.tolist() == [0] * (2 * taken)  # every replay leaves its counters zeroed
    for y in ys:
        assert _same_bits(y, static)
    # The replays do read those counters: one left at 5 skips tiles, once.
    with stream:  # on the graph's stream, so ordered before its replay
        page[2] = 5
        ys[1].fill(0)
    graph.launch(stream)
    stream.synchronize()
    assert _same_bits(ys[0], static) and not _same_bits(ys[1], static)
    graph.launch(stream)
    stream.synchronize()
    assert _same_bits(ys[1], static)


def test_graphs_replayed_at_once_on_two_streams_are_right() -> None:
    import cupy

    config, hidden, dtype = CASES[2]
    kernel, x, w, b, rows = _setup(config, hidden, dtype)
    static = _run(kernel, x, w, b, rows, work_ptr=0)
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(2)]
    ys = [cupy.zeros_like(x) for _ in streams]
    graphs = [_capture(kernel, x, w, b, [y], rows, s) for s, y in zip(streams, ys, strict=True)]
    cupy.cuda.Device().synchronize()
    for _ in range(4):  # the two graphs' replays overlap
        for g, s in zip(graphs, streams, strict=True):
            g.launch(s)
    cupy.cuda.Device().synchronize()
    for y in ys:
        assert _same_bits(y, static)


def test_concurrent_streams_each_get_their_own_counter() -> None:
    import cupy

    from autonorm.runtime import workspace

    config, hidden, dtype = CASES[2]
    kernel, x, w, b, rows = _setup(config, hidden, dtype)
    static = _run(kernel, x, w, b, rows, work_ptr=0)
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(3)]
    ptrs = {workspace.counter_for(0, s.ptr) for s in streams}
    assert len(ptrs) == 3 and 0 not in ptrs
    ys = [cupy.zeros_like(x) for _ in streams]
    cupy.cuda.Device().synchronize()
    for _ in range(4):  # launches on the three streams overlap
        for s, y in zip(streams, ys, strict=True):
            kernel.launch((x.data.ptr, w.data.ptr, b.data.ptr, y.data.ptr, rows, 1e-5), s.ptr)
    cupy.cuda.Device().synchronize()
    for y in ys:
        assert _same_bits(y, static)


def test_dispatch_runs_the_dynamic_schedule_verified() -> None:
    from autonorm.ops.layer_norm.verify import verify

    config, hidden, dtype = CASES[2]
    kernel, *_ = _setup(config, hidden, dtype)
    assert kernel.plan.resident  # the bulk kernel
    result = verify(kernel, Problem(hidden, dtype))
    assert result.ok, result.summary()


@pytest.mark.parametrize(("config", "hidden", "dtype"), CASES, ids=lambda v: str(v))
def test_keep_x_writes_the_same_bits(config, hidden, dtype) -> None:  # noqa: ANN001
    # keep_x changes only the L2 priority of x's copies, never a row's arithmetic: the same
    # bits, both schedules (a dirty counter shows these equalities can fail, above).
    import dataclasses

    from autonorm.ops import layer_norm as codegen
    from autonorm.runtime import compiler, workspace

    kept = dataclasses.replace(config, keep_x=True)
    rendered = codegen.render(kept, Problem(hidden, dtype))
    assert "L2::evict_last" in rendered.source
    kernel, x, w, b, rows = _setup(config, hidden, dtype)
    keep_kernel = compiler.compile_kernel(rendered)
    counter = workspace.new_counter(0)
    for work_ptr in (0, counter.data.ptr):
        plain = _run(kernel, x, w, b, rows, work_ptr=work_ptr)
        assert _same_bits(_run(keep_kernel, x, w, b, rows, work_ptr=work_ptr), plain)


@pytest.mark.parametrize(("config", "hidden", "dtype"), FWD_KEEP_CASES, ids=lambda v: str(v))
def test_keep_x_writes_the_same_bits_in_the_fwd_kernel(config, hidden, dtype) -> None:  # noqa: ANN001
    # As above for the fwd kernel's hinted loads: ld.global.nc with the policy returns what the
    # plain load does, so every output bit is the plain kernel's.
    import dataclasses

    from autonorm.ops import layer_norm as codegen
    from autonorm.runtime import compiler

    kept = dataclasses.replace(config, keep_x=True)
    rendered = codegen.render(kept, Problem(hidden, dtype))
    assert "L2::evict_last" in rendered.source
    kernel, x, w, b, rows = _setup(config, hidden, dtype, rows=1000 * config.rows_per_block + 3)
    plain = _run(kernel, x, w, b, rows, work_ptr=0)
    assert _same_bits(_run(compiler.compile_kernel(rendered), x, w, b, rows, work_ptr=0), plain)



def test_a_whole_gpu_gives_its_kernels_every_sm() -> None:
    # The driver's answer for the context (cuCtxGetExecAffinity, read through ctypes) must be
    # read right: without MPS a context may use every SM, or the driver cannot say.
    from autonorm.ops import layer_norm as codegen
    from autonorm.runtime import compiler, driver
    from autonorm.runtime.device import query_device

    config, hidden, dtype = CASES[0]
    info = query_device(0)
    kernel = compiler.compile_kernel(codegen.render(config, Problem(hidden, dtype)))
    assert driver.context_sm_count() in (None, info.sm_count)
    assert compiler.usable_sms(0, info.sm_count) == info.sm_count
    assert kernel.grid(10**6) == kernel.resident_clusters  # blocks: no cluster here


def test_a_green_context_counts_only_its_share_of_the_sms() -> None:
    # A green context owns a share of the SMs: a grid barrier sized to the device's count would
    # wait forever on blocks that find no SM of the share. The count must come from the driver
    # for the current context (cuCtxGetDevResource, read through ctypes with CUDA's layout).
    import ctypes

    import cupy

    from autonorm.runtime import driver
    from autonorm.runtime.device import query_device

    lib = driver.driver_library()
    if not lib or getattr(lib, "cuGreenCtxCreate", None) is None:
        pytest.skip("the driver has no green contexts (CUDA 12.4 on)")
    info = query_device(0)
    with cupy.cuda.Device(0):
        cupy.zeros(1)  # the primary context, current on this thread
    device = ctypes.c_int(0)
    assert lib.cuDeviceGet(ctypes.byref(device), 0) == 0
    whole = driver._DevResource()  # noqa: SLF001 - the layout under test
    assert lib.cuDeviceGetDevResource(device, ctypes.byref(whole), 1) == 0
    assert whole.sm_count == info.sm_count
    share, rest, groups = driver._DevResource(), driver._DevResource(), ctypes.c_uint(1)  # noqa: SLF001
    assert lib.cuDevSmResourceSplitByCount(ctypes.byref(share), ctypes.byref(groups),
                                           ctypes.byref(whole), ctypes.byref(rest), 0, 16) == 0
    assert groups.value == 1 and 16 <= share.sm_count < info.sm_count
    desc, green = ctypes.c_void_p(0), ctypes.c_void_p(0)
    assert lib.cuDevResourceGenerateDesc(ctypes.byref(desc), ctypes.byref(share), 1) == 0
    assert lib.cuGreenCtxCreate(ctypes.byref(green), desc, device, 1) == 0  # default stream
    try:
        context = ctypes.c_void_p(0)
        assert lib.cuCtxFromGreenCtx(ctypes.byref(context), green) == 0
        assert lib.cuCtxPushCurrent_v2(context) == 0
        try:
            assert driver.context_sm_count() == share.sm_count
        finally:
            popped = ctypes.c_void_p(0)
            assert lib.cuCtxPopCurrent_v2(ctypes.byref(popped)) == 0
    finally:
        assert lib.cuGreenCtxDestroy(green) == 0
    # Back in the primary context: every SM again.
    assert driver.context_sm_count() in (None, info.sm_count)
