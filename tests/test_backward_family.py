"""The backward families without a GPU: problems, space, default, rendering and the gate.

The verification gate is run on NumPy stand-ins of a kernel: one that computes the gradients
right passes; ones that drop dx's mean term, sum dweight over half the rows, differ between
two runs or leave a row unwritten are each rejected.
"""

from __future__ import annotations

import dataclasses
import types

import numpy as np
import pytest

from autonorm.codegen.kernel import LaunchPlan
from autonorm.errors import ConfigError
from autonorm.numerics import from_float64, to_float64
from autonorm.ops import registry
from autonorm.ops.norm_backward.config import BackwardConfig
from autonorm.ops.norm_backward.few_rows import (
    FEW_ROWS,
    FEW_THREADS,
    ONE_ROW_MAX_BYTES,
    ONE_ROW_MIN_BYTES,
    ONE_ROW_THREADS,
    ONE_ROW_VEC,
    REREAD_MIN_ROW_BYTES,
    REREAD_ROW_BYTES,
    REREAD_ROWS,
)
from autonorm.ops.norm_backward.plan import (
    MAX_CHAIN,
    ROWS_PER_CLUSTER,
    SPREAD_ROWS,
    check,
    derive_plan,
)
from autonorm.ops.norm_backward.problem import LayerNormBackward, RMSNormBackward
from autonorm.ops.norm_backward.space import SPLIT_ABOVE
from autonorm.ops.norm_backward.verify import verify
from autonorm.runtime.limits import H200

OPS = ("layer_norm_backward", "rms_norm_backward")


@pytest.mark.parametrize("op", OPS)
def test_registry_serves_both_families(op: str) -> None:
    family = registry.get(op)
    assert family.op == op
    problem = family.problem(hidden=4096, dtype="bf16")
    assert problem.dtype == "bfloat16"
    assert type(problem).op == op
    assert registry.family_of(problem) is family


def test_problem_fields_and_sums() -> None:
    ln = LayerNormBackward(4096, "float32", has_weight=True, has_bias=False)
    assert ln.fields() == {"hidden": 4096, "dtype": "float32", "has_weight": True,
                           "has_bias": False}
    assert ln.sums == 1
    rms = RMSNormBackward(4096, "float16", weight_offset=True)
    assert rms.sums == 1
    assert RMSNormBackward(4096, has_weight=False).sums == 0
    with pytest.raises(ValueError, match="needs a weight"):
        RMSNormBackward(4096, has_weight=False, weight_offset=True)


def test_label_round_trips() -> None:
    config = BackwardConfig(512, 4, "none", "smem", 3)
    assert BackwardConfig.from_label(config.label()) == config
    assert BackwardConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match="not a backward kernel label"):
        BackwardConfig.from_label("t256v8r1-smem-welford-c1-p0")


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("hidden", [1, 7, 768, 1000, 4096, 4099, 12288, 17249, 32768, 65535, 65536])
def test_every_shape_has_a_valid_default(op: str, dtype: str, hidden: int) -> None:
    family = registry.get(op)
    problem = family.problem(hidden=hidden, dtype=dtype)
    default = family.default(problem, H200)
    assert check(default, problem, H200) == []
    assert default in family.space(problem, H200)
    assert family.seeds(problem, H200)[0] == default
    kernel = family.render(default, problem, H200)
    assert kernel.launch.resident and kernel.launch.barrier
    assert kernel.name in kernel.source


def test_rules_name_the_problem() -> None:
    problem = LayerNormBackward(4099, "bfloat16")
    reasons = check(BackwardConfig(256, 8, "registers", "registers", 1), problem, H200)
    assert any("does not divide" in r for r in reasons)
    big = LayerNormBackward(65536, "float32")
    reasons = check(BackwardConfig(256, 4, "registers", "registers", 1), big, H200)
    assert any("cached in registers" in r for r in reasons)
    reasons = check(BackwardConfig(1024, 4, "none", "smem", 1), big, H200)
    assert any("shared memory" in r for r in reasons)
    with pytest.raises(ConfigError, match="cannot run"):
        registry.get("layer_norm_backward").render(
            BackwardConfig(256, 4, "registers", "registers", 1), big, H200)


def test_rendering_is_deterministic_and_distinct() -> None:
    family = registry.get("rms_norm_backward")
    problem = family.problem(hidden=8192, dtype="bfloat16")
    a = family.render(BackwardConfig(512, 8, "registers", "registers", 1), problem, H200)
    b = family.render(BackwardConfig(512, 8, "registers", "registers", 1), problem, H200)
    c = family.render(BackwardConfig(512, 8, "none", "smem", 1), problem, H200)
    assert a.source == b.source and a.name == b.name
    assert c.name != a.name and "reload(" in c.source and "reload(" not in a.source


def test_bytes_moved_counts_rows_weight_and_sums() -> None:
    family = registry.get("layer_norm_backward")
    problem = family.problem(hidden=1024, dtype="bfloat16")
    assert family.bytes_moved(problem, 10) == (3 * 10 + 1 + 2) * 1024 * 2


def test_no_sums_need_no_barrier() -> None:
    family = registry.get("rms_norm_backward")
    problem = family.problem(hidden=1024, dtype="float32", has_weight=False)
    kernel = family.render(family.default(problem, H200), problem, H200)
    assert not kernel.launch.barrier
    assert "counter[0]" not in kernel.source


@pytest.mark.parametrize("cluster", [1, 4])
def test_few_rows_get_a_block_a_column_tile(cluster: int) -> None:
    # LayerNorm 4096: dweight and dbias are 2 x 32 tiles of 128 columns.
    plan = LaunchPlan(256, 0, cluster, 1, 2, resident=True, barrier=True, reduce_tiles=64)
    # One row: one cluster, whose sums are the totals (no barrier, no counter).
    assert plan.grid(1, 132) == cluster
    assert not plan.uses_counter(1, plan.grid(1, 132))
    # A few rows: a block for each tile, most of them with no row, all meeting at the counter.
    assert plan.grid(3, 132) == 64
    assert plan.uses_counter(3, 64)
    # Rows past the tiles: a cluster a row up to the resident grid, as without the tiles.
    assert plan.grid(100, 132) == 100 * cluster if cluster == 1 else 264
    assert plan.grid(10**6, 132) == 264
    # The tiles never raise the grid past what can be resident.
    many = LaunchPlan(256, 0, cluster, 1, 1, resident=True, barrier=True, reduce_tiles=1024)
    assert many.grid(2, 132) == 132 // cluster * cluster


def test_few_rows_sum_only_the_rows_partials() -> None:
    family = registry.get("layer_norm_backward")
    problem = family.problem(hidden=4096, dtype="bfloat16")
    kernel = family.render(family.default(problem, H200), problem, H200)
    assert kernel.launch.reduce_tiles == 2 * 32
    source = kernel.source
    # One cluster writes its sums as the gradients; more write partial rows only where they
    # took a row, and the column sums read only those rows.
    assert "if (num_clusters == 1)" in source
    assert "if (cluster_id < takers)" in source
    assert "p < parts" in source and "parts = takers;" in source
    assert kernel.launch.spread_rows == SPREAD_ROWS
    assert kernel.launch.rows_per_block == ROWS_PER_CLUSTER
    # The template's rule for the clusters that take rows is the launch plan's.
    assert f"SPREAD = {SPREAD_ROWS};" in source and f"RPC = {ROWS_PER_CLUSTER};" in source


def test_past_spread_rows_a_cluster_takes_several() -> None:
    plan = LaunchPlan(256, 0, 1, 4, 2, resident=True, barrier=True, reduce_tiles=64,
                      spread_rows=16)
    # Up to 16 rows a cluster a row (and a block a tile); past them 4 rows a cluster.
    assert [plan.grid(r, 132) for r in (1, 2, 16, 64, 256, 512, 2048)] == [
        1, 64, 64, 64, 64, 128, 264]


class _Plan:
    cluster = 1


class NumpyKernel:
    """A backward 'kernel' in NumPy (float64, rounded to the dtype): the gate's stand-in."""

    plan = _Plan()

    def __init__(self, problem, flaw: str = "") -> None:  # noqa: ANN001
        self.problem = problem
        self.flaw = flaw
        self.calls = 0

    def grid(self, rows: int) -> int:
        return min(rows, 8)

    def launch_arrays(self, x, dy, w, dx, dw, db, partials, dh, rows, eps, grid=None) -> None:  # noqa: ANN001, PLR0913
        p = self.problem
        x64, dy64 = to_float64(x, p.dtype), to_float64(dy, p.dtype)
        w64 = None if w is None else to_float64(w, p.dtype)
        if self.flaw == "half-rows":
            half = dy64.copy()
            half[rows // 2:] = 0.0
            grads = p.gradients(x64, half, w64, eps)
            grads["dx"] = p.gradients(x64, dy64, w64, eps)["dx"]
        else:
            grads = p.gradients(x64, dy64, w64, eps)
        if self.flaw == "drop-mean":
            g = dy64 if w64 is None else dy64 * w64
            grads["dx"] = grads["dx"] + g.mean(axis=-1, keepdims=True) / np.sqrt(
                x64.var(axis=-1, keepdims=True) + eps)
        if self.flaw == "noisy":
            self.calls += 1
            grads["dweight"] = grads["dweight"] * (1.0 + 1e-7 * self.calls)
        if dh is not None and self.flaw != "drop-dh":
            grads["dx"] = grads["dx"] + to_float64(dh, p.dtype)
        out = from_float64(grads["dx"], p.dtype).view(dx.dtype)
        dx[:rows] = out
        if self.flaw == "short":
            dx[rows - 1] = dx[rows]  # the poison of the guard row: one row left unwritten
        if dw is not None:
            dw[:] = from_float64(grads["dweight"], p.dtype).view(dw.dtype)
        if db is not None:
            db[:] = from_float64(grads["dbias"], p.dtype).view(db.dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gate_passes_right_gradients(dtype: str) -> None:
    problem = LayerNormBackward(256, dtype)
    result = verify(NumpyKernel(problem), problem, xp=np)
    assert result.ok, result.summary()
    assert set(result.errors) >= {"normal/dx", "normal/dweight", "normal/dbias", "offset/dx"}


@pytest.mark.parametrize("flaw, message", [
    ("drop-mean", "normal/dx"),
    ("half-rows", "normal/dweight"),
    ("noisy", "two runs differ"),
    ("short", "unwritten"),
])
def test_gate_rejects_broken_gradients(flaw: str, message: str) -> None:
    problem = LayerNormBackward(256, "float32")
    result = verify(NumpyKernel(problem, flaw), problem, xp=np)
    assert not result.ok
    assert message in result.summary()


@pytest.mark.parametrize("problem", [LayerNormBackward(256, "float32", residual=True),
                                     RMSNormBackward(256, "bfloat16", residual=True)])
def test_gate_adds_the_returned_sums_gradient(problem) -> None:  # noqa: ANN001
    # After a residual add dx also carries the gradient of the returned h; a kernel that
    # leaves it out is rejected.
    assert verify(NumpyKernel(problem), problem, xp=np).ok
    result = verify(NumpyKernel(problem, "drop-dh"), problem, xp=np)
    assert not result.ok
    assert "dx" in result.summary()


def test_residual_problems_keep_plain_names_and_keys() -> None:
    plain = LayerNormBackward(4096, "bfloat16")
    fused = LayerNormBackward(4096, "bfloat16", residual=True)
    assert repr(plain) == ("LayerNormBackward(hidden=4096, dtype='bfloat16', has_weight=True, "
                           "has_bias=True)")
    assert "residual" not in plain.fields() and fused.fields()["residual"] is True
    assert "residual" in fused.describe() and "residual" not in plain.describe()
    family = registry.get("layer_norm_backward")
    config = family.default(plain, H200)
    assert family.render(config, plain, H200).name != family.render(config, fused, H200).name
    assert "dhr" in family.render(config, fused, H200).source
    assert "dhr" not in family.render(config, plain, H200).source
    # The returned h's gradient is read once more than the plain problem's inputs.
    assert (family.bytes_moved(fused, 10) - family.bytes_moved(plain, 10)
            == 10 * 4096 * fused.itemsize)


def test_gate_checks_rms_weight_offset() -> None:
    problem = RMSNormBackward(128, "float32", weight_offset=True)
    assert verify(NumpyKernel(problem), problem, xp=np).ok
    assert not verify(NumpyKernel(problem, "half-rows"), problem, xp=np).ok


# A GPU without the bulk-copy engine (an A100's limits).
A100 = dataclasses.replace(H200, name="NVIDIA A100-SXM4-80GB", cc=80, sm_count=108,
                           max_smem_optin=166912, smem_per_sm=167936, l2_bytes=41943040)


@pytest.mark.parametrize(("op", "dtype", "label"), [
    ("layer_norm_backward", "bfloat16", "t512v8-registers-accregisters-p1-f"),
    ("layer_norm_backward", "float32", "t256v4-registers-accregisters-p1-f"),
    ("rms_norm_backward", "bfloat16", "t512v8-registers-accregisters-p1-f"),
])
def test_default_prefetches_without_bulk_copy(op: str, dtype: str, label: str) -> None:
    # The defaults timed with and without prefetch at hidden 4096 on the H200
    # (docs/backward.md): the prefetching form won at each. Before Hopper it is the default.
    family = registry.get(op)
    problem = family.problem(hidden=4096, dtype=dtype)
    assert family.default(problem, A100).label() == label
    assert not [c for c in family.space(problem, A100) if c.cache == "bulk"]


@pytest.mark.parametrize(("op", "dtype", "hidden", "label"), [
    # The fastest of a grid of 36 bulk kernels (threads x blocks x stages x sums) at each
    # (H200, docs/backward.md); LayerNorm's held forms are below.
    ("rms_norm_backward", "bfloat16", 8192, "t512v8-bulk-accregisters-p1-s2-l"),
    ("rms_norm_backward", "float32", 4096, "t512v4-bulk-accregisters-p1-s2-l"),
])
def test_default_takes_the_bulk_kernel_measured_fastest(op, dtype, hidden, label) -> None:  # noqa: ANN001
    family = registry.get(op)
    assert family.default(family.problem(hidden=hidden, dtype=dtype), H200).label() == label


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("hidden", [1, 7, 768, 1000, 1024, 4096, 4099, 8192, 12288, 65536])
def test_few_rows_take_small_blocks_or_sum_from_the_rows(op: str, dtype: str, hidden: int) -> None:
    # At one row (where the row in registers does not serve it), and up to FEW_ROWS rows of more
    # than REREAD_ROW_BYTES: 128 threads, one to four vectors a thread, the row over a cluster
    # of up to four. From 2 rows (past the groups)
    # up to REREAD_ROWS: the default of many rows summing from the rows, where it is a bulk
    # kernel of whole rows of REREAD_MIN_ROW_BYTES or more. Past REREAD_ROWS the default of
    # any row count; every pick valid.
    family = registry.get(op)
    problem = family.problem(hidden=hidden, dtype=dtype)
    many = family.default(problem, H200)
    assert family.default(problem, H200, REREAD_ROWS + 1) == many
    reread = dataclasses.replace(many, acc="reread")
    whole_bulk = (many.cache == "bulk" and many.cluster == 1
                  and hidden * problem.itemsize >= REREAD_MIN_ROW_BYTES)
    vec = 16 // problem.itemsize
    small = hidden <= SPLIT_ABOVE and hidden % vec == 0 and hidden >= FEW_THREADS * vec
    for rows in (1, 16, FEW_ROWS, FEW_ROWS + 1, REREAD_ROWS):
        pick = family.default(problem, H200, rows)
        assert check(pick, problem, H200) == []
        assert pick in family.space(problem, H200)
        keep_few = small and (rows == 1 or (
            rows <= FEW_ROWS and hidden * problem.itemsize > REREAD_ROW_BYTES))
        if keep_few and rows == 1 and pick.cache == "registers":
            assert (pick.vec, pick.blocks_per_sm, pick.cluster) == (ONE_ROW_VEC, 1, 1)
        elif keep_few:
            shape = (pick.threads, pick.vec, pick.cache, pick.stages)
            assert shape == (FEW_THREADS, vec, "bulk", 2)
            assert pick.cluster == max(c for c in (1, 2, 4) if hidden // c >= FEW_THREADS * vec)
            assert derive_plan(pick, problem).iters <= 4
        elif rows > 1 and whole_bulk:
            assert pick == reread
        elif hidden > SPLIT_ABOVE:
            assert pick == many


def test_few_rows_default_is_the_form_measured_fastest() -> None:
    # LayerNorm bf16 4096 at 1 row: 3.3 us against the bulk default's 4.7; from 2 to 8 rows,
    # groups of it; at 64 and 256 rows the bulk default summing from the rows, 5.7 and 8.6 us
    # against the few-row form's 8.3 and the bulk default's 14.5 (H200, CUDA-graph replay,
    # docs/backward.md).
    family = registry.get("layer_norm_backward")
    problem = family.problem(hidden=4096, dtype="bfloat16")
    assert family.default(problem, H200, 1).label() == "t256v4-registers-accregisters-p1"
    assert family.default(problem, H200, 8).groups > 1
    for rows in (9, 64, 256):
        assert family.default(problem, H200, rows).label() == "t256v8-bulk-accreread-p1-s4-h-l"
    assert family.default(problem, H200, 257).label() == "t256v8-bulk-accregisters-p1-s4-h-l"
    # fp32 8192 (32 KB rows) keeps the few-row form at 64 rows: 6.8 us against 8.9 (RMSNorm).
    fp32 = family.problem(hidden=8192, dtype="float32")
    assert family.default(fp32, H200, 64).label() == "t128v4-bulk-accregisters-p1-s2-c4"
    assert family.default(fp32, H200, 128).acc == "reread"
    assert family.default(problem, A100, 8).cache != "bulk"


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("hidden", [512, 768, 1000, 1024, 2048, 4096, 4099, 6144, 8192, 16384])
def test_one_row_holds_short_rows_in_registers(op: str, dtype: str, hidden: int) -> None:
    # At one row, rows of ONE_ROW_MIN_BYTES to the norm's ONE_ROW_MAX_BYTES that the vector of
    # ONE_ROW_VEC elements divides take one block holding the row in registers, the fewest
    # threads that run it, sums in registers where those run; other rows keep the few-row
    # form's bulk copy, and two rows the groups.
    family = registry.get(op)
    problem = family.problem(hidden=hidden, dtype=dtype)
    pick = family.default(problem, H200, 1)
    assert check(pick, problem, H200) == []
    row_bytes = hidden * problem.itemsize
    held = (ONE_ROW_MIN_BYTES <= row_bytes <= ONE_ROW_MAX_BYTES[problem.norm]
            and hidden % ONE_ROW_VEC == 0)
    if not held:
        assert pick.cache != "registers" or hidden % (16 // problem.itemsize)
        return
    assert (pick.cache, pick.vec, pick.blocks_per_sm, pick.prefetch) == (
        "registers", ONE_ROW_VEC, 1, False)
    assert pick.threads in ONE_ROW_THREADS
    # Every form the rule tries before its pick (sums in registers first, then the fewest
    # threads) cannot run the problem.
    fewer = [dataclasses.replace(pick, threads=t, acc=a) for t in ONE_ROW_THREADS
             for a in ("registers", "smem") if (a, t) < (pick.acc, pick.threads)]
    assert all(check(c, problem, H200) for c in fewer), [c.label() for c in fewer]
    assert family.default(problem, H200, 2).cache == "bulk"
    # Only where the few-row bulk form runs: before Hopper one row keeps the default of any rows.
    assert family.default(problem, A100, 1) == family.default(problem, A100)


def test_one_row_defaults_are_the_kernels_measured_fastest() -> None:
    # By CUDA-graph replay at one row (H100, docs/backward.md): LayerNorm bf16 4096 3.4 us
    # against the few-row form's 3.7, RMSNorm bf16 4096 2.3 against 3.3, fp32 1024 1.5 against
    # 2.8; LayerNorm bf16 8192 (16 KB) keeps the few-row form, 4.4 us against 5.5.
    ln, rms = registry.get("layer_norm_backward"), registry.get("rms_norm_backward")
    cases = [(ln, "bfloat16", 1024, "t128v4-registers-accregisters-p1"),
             (ln, "bfloat16", 4096, "t256v4-registers-accregisters-p1"),
             (ln, "float32", 1024, "t128v4-registers-accregisters-p1"),
             (rms, "bfloat16", 4096, "t128v4-registers-accregisters-p1"),
             (rms, "bfloat16", 8192, "t256v4-registers-accregisters-p1"),
             (rms, "float32", 1024, "t128v4-registers-accregisters-p1"),
             (rms, "float32", 4096, "t128v4-registers-accregisters-p1"),
             (ln, "bfloat16", 8192, "t128v8-bulk-accregisters-p1-s2-c4"),
             (ln, "float32", 4096, "t128v4-bulk-accregisters-p1-s2-c4"),
             (rms, "float32", 8192, "t128v4-bulk-accregisters-p1-s2-c4")]
    for family, dtype, hidden, label in cases:
        problem = family.problem(hidden=hidden, dtype=dtype)
        assert family.default(problem, H200, 1).label() == label, (family.op, dtype, hidden)


def test_long_rows_keep_sums_out_of_l2_behind_bulk_stages() -> None:
    # LayerNorm fp32 16384: whole-row bulk stages leave room only for sums in L2 (17-40% of
    # copy); a reloaded row with its sums in shared memory ran 60%, and a cluster of four with
    # its sums in shared memory 82.5%.
    family = registry.get("layer_norm_backward")
    default = family.default(family.problem(hidden=16384, dtype="float32"), H200)
    assert (default.cache, default.acc, default.cluster) == ("bulk", "smem", 4)


@pytest.mark.parametrize(("op", "dtype", "hidden", "label"), [
    # Past 8192 elements rows split over the smallest cluster that leaves a block 4096 or
    # fewer, 256 threads and two blocks an SM, held: the fastest form timed at each of these
    # (H200, docs/backward.md).
    ("layer_norm_backward", "bfloat16", 12288, "t256v8-bulk-accregisters-p2-s2-c4-h-l"),
    ("layer_norm_backward", "bfloat16", 16384, "t256v8-bulk-accregisters-p2-s2-c4-h-l"),
    ("layer_norm_backward", "bfloat16", 32768, "t256v8-bulk-accregisters-p2-s2-c8-h-l"),
    ("rms_norm_backward", "bfloat16", 32768, "t256v8-bulk-accregisters-p2-s2-c8-h-l"),
    ("rms_norm_backward", "float32", 32768, "t256v4-bulk-accregisters-p2-s2-c8-h-l"),
    ("layer_norm_backward", "float32", 12288, "t256v4-bulk-accregisters-p2-s2-c4-h-l"),
    # Where that form does not fit, the cluster's bulk pick, held where that fits.
    ("layer_norm_backward", "bfloat16", 65536, "t512v8-bulk-accregisters-p1-s2-c8-h-l"),
    ("rms_norm_backward", "float32", 65536, "t512v4-bulk-accregisters-p1-s2-c8-h-l"),
    # Where no kernel of 8 blocks holds its share with two stages, 16 blocks that do (Hopper):
    # x1.18-3.3 over the kernel of 8 (H100, docs/backward.md).
    ("layer_norm_backward", "float32", 65536, "t256v4-bulk-accsmem-p2-s2-c16-h"),
    ("layer_norm_backward", "float32", 131072, "t512v4-bulk-accsmem-p1-s2-c16-h"),
    ("rms_norm_backward", "bfloat16", 131072, "t512v8-bulk-accregisters-p1-s2-c16-h-l"),
    ("rms_norm_backward", "float32", 98304, "t512v4-bulk-accregisters-p1-s2-c16-h-l"),
    # Eight blocks that hold their share with two stages keep it (bf16 49152: 59.8% of copy
    # against 47.7% over 16 blocks).
    ("layer_norm_backward", "bfloat16", 49152, "t256v8-bulk-accsmem-p2-s2-c8-h"),
])
def test_long_rows_split_over_a_cluster(op: str, dtype: str, hidden: int, label: str) -> None:
    family = registry.get(op)
    assert family.default(family.problem(hidden=hidden, dtype=dtype), H200).label() == label


def test_whole_rows_come_before_clusters() -> None:
    # LayerNorm bf16 8192: the held whole row ran 77.0% of copy, the fastest cluster kernel
    # 70.8% (H200, docs/backward.md).
    family = registry.get("layer_norm_backward")
    default = family.default(family.problem(hidden=8192, dtype="bfloat16"), H200)
    assert default.label() == "t512v8-bulk-accregisters-p1-s2-h-l"
    # Rows no cluster splits into whole 16-byte vectors stay whole.
    odd = family.default(family.problem(hidden=12296, dtype="bfloat16"), H200)
    assert odd.cluster == 1


def test_bulk_rules() -> None:
    problem = LayerNormBackward(4096, "bfloat16")
    bulk = BackwardConfig(256, 8, "bulk", "registers", 2, stages=2)
    assert check(bulk, problem, H200) == []
    assert BackwardConfig.from_label(bulk.label()) == bulk
    assert bulk.label() == "t256v8-bulk-accregisters-p2-s2"
    assert any("compute capability 9.0" in r for r in check(bulk, problem, A100))
    assert any("16-byte" in r for r in check(dataclasses.replace(bulk, vec=4), problem, H200))
    assert any("1 or more stages" in r
               for r in check(dataclasses.replace(bulk, stages=0), problem, H200))
    assert any("cache='bulk' only" in r
               for r in check(BackwardConfig(256, 8, "registers", "registers", 2, stages=2),
                              problem, H200))
    # Four stages of 16 KB rows (x and dy) for each of 4 blocks do not fit an SM.
    assert any("do not fit an SM" in r
               for r in check(dataclasses.replace(bulk, blocks_per_sm=4, stages=4), problem,
                              H200))


def test_cluster_rules_and_plan() -> None:
    problem = LayerNormBackward(65536, "bfloat16")
    config = BackwardConfig(512, 8, "bulk", "registers", 1, stages=2, cluster=8)
    assert check(config, problem, H200) == []
    assert config.label() == "t512v8-bulk-accregisters-p1-s2-c8"
    assert BackwardConfig.from_label(config.label()) == config
    plan = derive_plan(config, problem)
    assert (plan.seg, plan.nvec, plan.iters) == (8192, 1024, 2)
    assert plan.smem_bytes == 2 * 2 * 8192 * 2 + 2 * 8  # this block's share of x and dy
    assert any("cache='bulk'" in r for r in check(
        BackwardConfig(512, 8, "registers", "registers", 1, cluster=2), problem, H200))
    assert any("cannot split hidden" in r for r in check(
        dataclasses.replace(config, cluster=8), LayerNormBackward(8200, "bfloat16"), H200))
    assert any("compute capability 9.0" in r for r in check(config, problem, A100))
    kernel = registry.get("layer_norm_backward").render(config, problem, H200)
    assert kernel.launch.cluster == 8
    assert "__cluster_dims__(8, 1, 1)" in kernel.source


def test_clusters_past_eight_blocks_are_hoppers() -> None:
    problem = LayerNormBackward(65536, "float32")
    config = BackwardConfig(256, 4, "bulk", "smem", 2, stages=2, cluster=16, hold=True)
    assert check(config, problem, H200) == []
    assert BackwardConfig.from_label(config.label()) == config
    # The portable 8 elsewhere (Blackwell until one is measured), and on Hopper no default of
    # a row held over 8 blocks moves to 16.
    blackwell = dataclasses.replace(H200, name="NVIDIA B200", cc=100, sm_count=148)
    assert blackwell.max_cluster_blocks == 8
    assert any("exceeds the 8 this device launches" in r
               for r in check(config, problem, blackwell))
    family = registry.get("layer_norm_backward")
    assert family.default(problem, blackwell).cluster == 8
    assert all(c.cluster <= 8 for c in family.space(problem, blackwell))
    assert any(c.cluster == 16 for c in family.space(problem, H200))
    kernel = family.render(config, problem, H200)
    assert (kernel.launch.cluster, kernel.launch.resident) == (16, True)
    assert "__cluster_dims__(16, 1, 1)" in kernel.source


def test_a_held_exchange_by_lanes_gives_each_lane_one_total() -> None:
    # LayerNorm passes four totals: 8 blocks fill a warp's lanes, 16 would need 64.
    held = BackwardConfig(256, 4, "bulk", "registers", 1, stages=2, cluster=16, hold=True,
                          lanes=True)
    reasons = check(held, LayerNormBackward(65536, "float32"), H200)
    assert any("at most 32" in r for r in reasons), reasons
    assert check(dataclasses.replace(held, cluster=8), LayerNormBackward(32768, "float32"),
                 H200) == []
    # RMSNorm's two totals over 16 blocks fill them exactly; a row read from its stage in every
    # pass exchanges thread by thread, at any cluster.
    assert check(held, RMSNormBackward(65536, "float32"), H200) == []
    assert check(dataclasses.replace(held, hold=False), LayerNormBackward(65536, "float32"),
                 H200) == []


def test_a_case_grid_counts_clusters() -> None:
    # Verification's small grids (one block, three) launch whole clusters.
    problem = LayerNormBackward(64, "float32")
    kernel = NumpyKernel(problem)
    grids = []
    launch = kernel.launch_arrays

    def record(*args, grid=None):  # noqa: ANN002, ANN202
        grids.append(grid)
        launch(*args, grid=grid)

    kernel.launch_arrays = record
    kernel.plan = types.SimpleNamespace(cluster=4)
    assert verify(kernel, problem, xp=np).ok
    assert {g for g in grids if g is not None} == {4, 12}


def test_bulk_plan_places_the_stages_after_the_sums() -> None:
    problem = LayerNormBackward(1024, "float32")
    plan = derive_plan(BackwardConfig(128, 4, "bulk", "smem", 2, stages=3), problem)
    assert plan.stage_offset == 2 * 1024 * 4
    assert plan.smem_bytes == 2 * 1024 * 4 + 3 * 2 * 1024 * 4 + 3 * 8


def test_one_thread_sums_at_most_max_chain_elements() -> None:
    # sum(x^2) of a constant fp32 row of 65536 on one warp (2048 elements a thread) was off
    # by 1.2e-5 on the H200.
    problem = RMSNormBackward(65536, "float32")
    reasons = check(BackwardConfig(32, 2, "none", "global", 4), problem, H200)
    assert any(f"the {MAX_CHAIN} one fp32 sum may take" in r for r in reasons)
    for config in registry.get("rms_norm_backward").space(problem, H200):
        assert derive_plan(config, problem).iters * config.vec <= MAX_CHAIN


def test_prefetch_needs_the_row_in_registers() -> None:
    problem = LayerNormBackward(16384, "float32")
    reasons = check(BackwardConfig(512, 4, "none", "smem", 1, prefetch=True), problem, H200)
    assert any("prefetch" in r for r in reasons)
    assert BackwardConfig.from_label("t512v4-none-accsmem-p1-f").prefetch


def test_partials_hold_one_row_of_sums_a_cluster_with_a_row() -> None:
    assert LayerNormBackward(100).partial_floats(5, 3) == 3 * 2 * 100
    assert RMSNormBackward(100).partial_floats(5, 3) == 3 * 100
    # Only clusters that take a row write one.
    assert RMSNormBackward(100).partial_floats(2, 3) == 2 * 100
    # No sums: a one-element buffer, so a launch always has a valid pointer.
    assert LayerNormBackward(100, has_weight=False, has_bias=False).partial_floats(3, 3) == 1
    # Or four statistics a row for sums formed from the rows, where that is more.
    assert LayerNormBackward(1).partial_floats(5, 3) == 4 * 5


def test_hold_rules_label_and_plan() -> None:
    problem = LayerNormBackward(4096, "bfloat16")
    held = BackwardConfig(256, 8, "bulk", "registers", 1, stages=2, hold=True)
    assert check(held, problem, H200) == []
    assert held.label() == "t256v8-bulk-accregisters-p1-s2-h"
    assert BackwardConfig.from_label(held.label()) == held
    clustered = dataclasses.replace(held, cluster=2)
    assert BackwardConfig.from_label(clustered.label()) == clustered
    # The estimate's rates fitted to ptxas: one register an element for LayerNorm, one and a
    # half for RMSNorm, on top of the same kernel without.
    plain = dataclasses.replace(held, hold=False)
    assert derive_plan(held, problem).regs - derive_plan(plain, problem).regs == 16
    rms = RMSNormBackward(4096, "bfloat16")
    assert derive_plan(held, rms).regs - derive_plan(plain, rms).regs == 24
    assert any("cache='bulk'" in r for r in check(
        BackwardConfig(256, 8, "registers", "registers", 1, hold=True), problem, H200))
    # 64 elements a thread (one warp of 16384) are past what registers hold.
    wide = BackwardConfig(32, 8, "bulk", "smem", 1, stages=1, hold=True)
    assert any("held in registers" in r
               for r in check(wide, LayerNormBackward(16384, "bfloat16"), H200))


def test_hold_keeps_the_names_of_kernels_without_it() -> None:
    from autonorm.ops.norm_backward.codegen import kernel_name

    problem = LayerNormBackward(4096, "bfloat16")
    plain = BackwardConfig(256, 8, "bulk", "registers", 2, stages=2)
    # The name this kernel had before `hold` existed: stored winners keep their digests.
    assert kernel_name(plain, problem) == "autonorm_ln_bwd_cef12b0928456aa7"
    assert kernel_name(dataclasses.replace(plain, hold=True), problem) != kernel_name(
        plain, problem)


@pytest.mark.parametrize(("op", "dtype", "hidden", "label"), [
    # LayerNorm holds its row (H200, docs/backward.md): half the blocks with twice the stages,
    # held, where the space has it (bf16 2048 80.8% of copy against 67.5% for the held twin,
    # 4096 76.5% against 72.5%); else the held twin of the bulk pick (bf16 1024 x1.19, 3072
    # x1.22, 8192 x1.20).
    ("layer_norm_backward", "bfloat16", 2048, "t128v8-bulk-accregisters-p2-s4-h-l"),
    ("layer_norm_backward", "bfloat16", 4096, "t256v8-bulk-accregisters-p1-s4-h-l"),
    ("layer_norm_backward", "bfloat16", 1024, "t128v8-bulk-accregisters-p4-s4-h-l"),
    ("layer_norm_backward", "bfloat16", 3072, "t256v8-bulk-accregisters-p2-s3-h-l"),
    ("layer_norm_backward", "bfloat16", 8192, "t512v8-bulk-accregisters-p1-s2-h-l"),
    # fp32 rows and RMSNorm gained nothing from holding a whole row (fp32 2048: 94.1% of copy
    # without, 92.4% half the blocks held).
    ("layer_norm_backward", "float32", 2048, "t256v4-bulk-accregisters-p2-s2-l"),
    ("layer_norm_backward", "float32", 4096, "t512v4-bulk-accregisters-p1-s2-l"),
    ("rms_norm_backward", "bfloat16", 1024, "t128v8-bulk-accregisters-p4-s4-l"),
])
def test_layer_norm_default_holds_its_row_where_it_fits(op, dtype, hidden, label) -> None:  # noqa: ANN001
    family = registry.get(op)
    assert family.default(family.problem(hidden=hidden, dtype=dtype), H200).label() == label


@pytest.mark.parametrize(("op", "hidden", "dtype", "form"), [
    ("layer_norm_backward", 4096, "bfloat16", {}),
    ("layer_norm_backward", 1000, "float32", {"has_weight": False, "has_bias": False}),
    ("rms_norm_backward", 65536, "bfloat16", {"residual": True}),
    ("rms_norm_backward", 100, "float16", {}),
])
def test_the_space_is_every_candidate_that_check_accepts(op: str, hidden: int, dtype: str,
                                                         form: dict) -> None:
    # The space skips whole branches of candidates before checking them; what it keeps must be
    # exactly what check accepts of the product of the fields that apply to each cache, in its
    # order, with and without bulk copy.
    import itertools

    from autonorm.ops.norm_backward import config as fields
    from autonorm.ops.norm_backward.space import enumerate_space

    def product():  # noqa: ANN202
        for threads, vec, cache, acc, blocks in itertools.product(
                fields.THREADS, fields.VECS, fields.CACHES, fields.ACCS, fields.BLOCKS_PER_SM):
            bulk = cache == "bulk"
            for rest in itertools.product(
                    (False, True) if cache == "registers" else (False,),
                    fields.STAGES[1:] if bulk else (0,), fields.CLUSTERS if bulk else (1,),
                    (False, True) if bulk else (False,), fields.GROUPS if bulk else (1,),
                    (False, True) if threads >= fields.LANES_MIN_THREADS else (False,)):
                yield BackwardConfig(threads, vec, cache, acc, blocks, *rest)

    problem = registry.get(op).problem(hidden=hidden, dtype=dtype, **form)
    for device in (H200, A100):
        accepted = [c for c in product() if not check(c, problem, device)]
        assert accepted
        assert enumerate_space(problem, device) == accepted


def test_lanes_is_a_knob_of_two_warps_or_more() -> None:
    problem = LayerNormBackward(4096, "bfloat16")
    lanes = BackwardConfig(256, 8, "bulk", "registers", 1, stages=4, hold=True, lanes=True)
    assert lanes.label() == "t256v8-bulk-accregisters-p1-s4-h-l"
    assert BackwardConfig.from_label(lanes.label()) == lanes
    assert check(lanes, problem, H200) == []
    one_warp = BackwardConfig(32, 8, "bulk", "registers", 1, stages=2, lanes=True)
    assert any("one warp" in r for r in check(one_warp, LayerNormBackward(256, "bfloat16"), H200))
    space = registry.get("layer_norm_backward").space(problem, H200)
    assert lanes in space
    assert dataclasses.replace(lanes, lanes=False) in space
    # The lane-by-lane sums render their own reduction; without the knob the kernel's name and
    # source are those of the kernel before the knob existed.
    family = registry.get("layer_norm_backward")
    with_lanes = family.render(lanes, problem, H200).source
    without = family.render(dataclasses.replace(lanes, lanes=False), problem, H200).source
    assert "lane l ends with the total" in with_lanes
    assert "lane l ends with the total" not in without


@pytest.mark.parametrize(("op", "dtype", "hidden", "rows", "lanes"), [
    # Sums in registers behind bulk stages meet lane by lane (x1.01-1.14 over the thread-by-
    # thread sums, H200, docs/backward.md); sums in shared memory (a held 16-bit 65536 kernel
    # without a bias lost 8%) and the few-row forms (1-2%) keep the thread-by-thread sums, and
    # so do kernels without bulk copy, where lanes were not timed. Sums formed from the rows
    # keep the lanes of the kernel they come from.
    ("layer_norm_backward", "bfloat16", 4096, None, True),
    ("layer_norm_backward", "bfloat16", 65536, None, True),
    ("rms_norm_backward", "float32", 8192, None, True),
    ("layer_norm_backward", "float32", 16384, None, False),
    ("layer_norm_backward", "bfloat16", 4096, 8, False),
    ("layer_norm_backward", "bfloat16", 1024, 1, False),
    ("layer_norm_backward", "bfloat16", 4096, 64, True),
])
def test_default_meets_sums_in_registers_lane_by_lane(op, dtype, hidden, rows, lanes) -> None:  # noqa: ANN001
    family = registry.get(op)
    problem = family.problem(hidden=hidden, dtype=dtype)
    default = family.default(problem, H200, rows)
    assert default.lanes is lanes
    if rows is None:
        assert default.lanes == (default.acc == "registers")
    else:
        # At few rows only the sums formed from the rows take lanes: from the many-rows pick.
        many = family.default(problem, H200)
        assert default.lanes == (default.acc == "reread" and many.lanes)
    assert not family.default(problem, A100, rows).lanes


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_split_rows_past_24_elements_a_thread_keep_sums_out_of_shared_memory(dtype) -> None:  # noqa: ANN001
    # 16-bit LayerNorm 65536 without a bias: the split form with its sums in shared memory (32
    # elements a thread) ran 64.2% (bf16) and 54.9% (fp16) of copy, this kernel 76.2% and 73.0%
    # (H200, docs/backward.md).
    family = registry.get("layer_norm_backward")
    nobias = family.problem(hidden=65536, dtype=dtype, has_bias=False)
    assert family.default(nobias, H200).label() == "t512v8-bulk-accregisters-p1-s2-c8-h-l"
    # At 16 elements a thread the form with its sums in shared memory stays, without lanes.
    assert family.default(family.problem(hidden=16384, dtype="float32"), H200).label() == (
        "t256v4-bulk-accsmem-p2-s2-c4-h")
