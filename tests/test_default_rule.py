"""The untuned default's rule (autonorm.ops.layer_norm.heuristic), on the CPU.

Validity everywhere (every pick passes ``check`` on an H200, an A100 and a B200), the branches
the tuned evidence draws (docs/tuning.md), their dependence on the device's properties and the
row count's bucket, and the search's seeds around it.
"""

from __future__ import annotations

import dataclasses

import pytest

from autonorm.dtypes import DTYPES
from autonorm.export.arch import A100, B200
from autonorm.ops import registry
from autonorm.ops.base import rows_bucket
from autonorm.ops.layer_norm import bulk_picks, few_rows, heuristic, space
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.family import FAMILY
from autonorm.ops.layer_norm.heuristic import default_config, row_kernel_default
from autonorm.ops.layer_norm.plan import derive_plan
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.rules import check
from autonorm.ops.rms_norm.problem import Problem as RmsProblem
from autonorm.runtime.limits import H200, DeviceLimits

DEVICES = {"H200": H200, "A100": A100, "B200": B200}


def _hidden_sizes() -> list[int]:
    sizes = set(range(1, 257, 5)) | set(range(257, 70001, 331))  # odd strides: both parities
    for k in range(17):  # powers of two, their neighbours and 3 x 2^k
        for n in (1 << k, (1 << k) - 1, (1 << k) + 1, 3 << k):
            if 1 <= n <= 70000:
                sizes.add(n)
    sizes.update({768, 1000, 5000, 12288, 14336, 20000, 24576, 49152, 69997, 70000})
    return sorted(sizes)


@pytest.mark.parametrize("device", DEVICES.values(), ids=DEVICES.keys())
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_rule_picks_a_valid_config_everywhere(dtype, device):
    sizes = _hidden_sizes()
    assert {1, 2, 3, 65535, 65536, 65537} <= set(sizes)
    bad, kinds = [], set()
    for hidden in sizes:
        problem = Problem(hidden, dtype)
        for rows in (None, 1, 8, 64, 4096, max(1, 2**26 // hidden)):
            config = default_config(problem, device, rows)
            reasons = check(config, problem, device)
            if reasons:
                bad.append((hidden, rows, config.label(), reasons))
            kinds.add((config.cache == "bulk", config.cluster > 1))
    assert not bad, bad[:10]
    if device.cc >= 90:  # the whole space is used: bulk, clustered and row kernels
        assert {(False, False), (True, False), (True, True)} <= kinds, kinds
    else:  # no bulk-copy engine, no clusters: the row kernel
        assert kinds == {(False, False)}, kinds


@pytest.mark.parametrize("dtype", DTYPES)
def test_older_gpus_and_unknown_rows_take_the_row_kernels_default(dtype):
    for hidden in (7, 768, 5000, 16384, 65536):
        problem = Problem(hidden, dtype)
        for rows in (1, 64, 4096, 2**26 // hidden):
            assert default_config(problem, A100, rows) == row_kernel_default(problem, A100)
        assert default_config(problem, H200) == row_kernel_default(problem, H200)
        assert default_config(problem) == space.default_config(problem)
        assert FAMILY.default(problem, H200, 4096) == default_config(problem, H200, 4096)


# The shipped H200 winners the rule reproduces, one of each branch (docs/results.md).
PICKS = [
    # bandwidth (rows = 2^26 / hidden): bulk from 16 KB rows, x kept in L2
    (Problem(8192, "bfloat16"), 8192, "t128v8r1-bulk-two_pass-c1-p0-s4-k"),
    (Problem(12288, "float32"), 5461, "t512v4r1-bulk-two_pass-c1-p0-s3-k"),
    (Problem(32768, "bfloat16"), 2048, "t512v8r1-bulk-two_pass-c1-p0-s2-k"),
    (Problem(65536, "float32"), 1024, "t256v4r1-bulk-two_pass-c8-p0-s2-k"),
    # the row kernel under 16 KB, fp32 one row a block
    (Problem(768, "bfloat16"), 87381, "t128v8r4-registers-two_pass-c1-p0-k-m64"),
    (Problem(1024, "float32"), 65536, "t64v4r1-registers-two_pass-c1-p0-k"),
    # 4,096 rows: the row kernel up to 8192 without the hint, bulk from 16384
    (Problem(8192, "float16"), 4096, "t256v8r1-smem-two_pass-c1-p0-m64"),
    (Problem(4096, "float32"), 4096, "t256v4r1-registers-two_pass-c1-p0"),
    (Problem(16384, "bfloat16"), 4096, "t256v8r1-bulk-two_pass-c1-p0-s3-k"),
    # a few rows: 16384 split over 8 blocks; at 64-512 rows 32 KB segments, fp32 over 2
    (Problem(16384, "float32"), 1, "t128v4r1-bulk-two_pass-c8-p0-s1"),
    (Problem(16384, "float16"), 8, "t128v8r1-bulk-two_pass-c8-p0-s1"),
    (Problem(16384, "float32"), 64, "t256v4r1-bulk-two_pass-c2-p0-s2"),
    (Problem(16384, "bfloat16"), 512, "t256v8r1-bulk-two_pass-c1-p0-s3"),
]


@pytest.mark.parametrize(("problem", "rows", "label"), PICKS,
                         ids=[f"{p.dtype}-{p.hidden}-r{r}" for p, r, _ in PICKS])
def test_the_rule_reproduces_tuned_winners(problem, rows, label):
    assert default_config(problem, H200, rows).label() == label


def test_the_pick_depends_on_the_rows_bucket_only():
    # Dispatch caches a kernel per bucket, whichever row count came first.
    for problem in (Problem(16384, "float32"), Problem(8192, "bfloat16"), Problem(3000)):
        for rows in (1, 3, 9, 17, 100, 1000, 3000, 5000, 70000):
            assert default_config(problem, H200, rows) == default_config(
                problem, H200, rows_bucket(rows)), (problem, rows)


def test_the_rule_reads_the_devices_sms_and_l2():
    bf16_8192 = Problem(8192, "bfloat16")
    # 4,096 rows on 132 SMs are 31 an SM: the row kernel; on 66 SMs 62: the bulk kernel.
    assert default_config(bf16_8192, H200, 4096).cache == "smem"
    half = dataclasses.replace(H200, sm_count=66)
    assert default_config(bf16_8192, half, 4096).cache == "bulk"
    # x of 128 MB is twice the H200's 60 MB L2, not the B200's 126 MB: the hint on the H200 only.
    bf16_16384 = Problem(16384, "bfloat16")
    assert default_config(bf16_16384, H200, 4096).keep_x
    on_b200 = default_config(bf16_16384, B200, 4096)
    assert on_b200.cache == "bulk" and not on_b200.keep_x
    # 8 rows x a cluster of 8 fit 132 SMs; on 48 SMs only clusters of 4 do.
    assert default_config(bf16_16384, H200, 8).cluster == 8
    assert default_config(bf16_16384, dataclasses.replace(H200, sm_count=48), 8).cluster == 4


def test_the_rule_fits_its_stages_to_the_shared_memory():
    small = DeviceLimits(name="small Hopper", max_smem_optin=99 * 1024, smem_per_sm=100 * 1024)
    fp32_16384 = Problem(16384, "float32")
    on_h200 = default_config(fp32_16384, H200, 4096)
    config = default_config(fp32_16384, small, 4096)
    assert on_h200.stages * 64 * 1024 > small.max_smem_optin  # the H200's pick would not fit
    assert config.cache == "bulk" and check(config, fp32_16384, small) == []


def test_rows_the_bulk_kernel_cannot_take_fall_to_the_row_kernel():
    # Skewed rows over 64 KB after the residual add would need a cluster, which the bulk kernel
    # gives them only without it; few short rows are not split (the split gained nothing under
    # 32 KB).
    for problem, rows in ((Problem(26531, "float32", residual=True), 2529),
                          (Problem(40001, "bfloat16", residual=True), 1677),
                          (Problem(4096, "bfloat16"), 1), (Problem(6144, "float32"), 8)):
        config = default_config(problem, H200, rows)
        assert config.cache != "bulk" and config.cluster == 1, (problem, rows, config.label())
        assert check(config, problem) == []


@pytest.mark.parametrize(("dtype", "hidden", "label"), [
    ("float32", 26531, "t256v4r1-bulk-two_pass-c4-p0-s2-k"),
    ("float32", 40001, "t256v4r1-bulk-two_pass-c8-p0-s2-k"),
    ("bfloat16", 40001, "t256v8r1-bulk-two_pass-c4-p0-s2-k"),
    ("float16", 65535, "t512v8r1-bulk-two_pass-c4-p0-s2-k"),
])
def test_many_skewed_rows_past_64_kb_split_over_a_bulk_cluster(dtype, hidden, label):
    # Runs of the row's aligned vectors of up to 32 KB a block, the fewest threads that keep a
    # thread to 8 vectors, two stages (H100: fp32 26531 89.6% of copy against the row kernel's
    # 82.3%, fp32 40001 92.4% against 79.3%, bf16 40001 83.6% against 76.5%).
    problem = Problem(hidden, dtype)
    config = default_config(problem, H200, (1 << 26) // hidden)
    assert config.label() == label
    shape = derive_plan(config, problem, H200).shape
    assert shape.skewed and shape.ragged and shape.iters <= 8
    assert check(config, problem) == []
    # RMSNorm takes the same split
    assert default_config(RmsProblem(hidden, dtype), H200, (1 << 26) // hidden).cluster > 1


def test_few_rows_the_bulk_kernel_cannot_split_take_the_row_kernels_cluster():
    # Skewed rows, and rows whose vectors no cluster of 4 or 8 divides (27656 = 8 x 3457), of
    # 32 KB and more: each over a cluster of 8 row-kernel blocks while rows x 8 fit the SMs.
    for problem in (Problem(26531, "float32"), Problem(20001, "float32"),
                    Problem(26531, "bfloat16"), Problem(27656, "float32"),
                    Problem(27656, "bfloat16"), RmsProblem(26531, "bfloat16"),
                    Problem(27656, "float32", residual=True)):
        for rows in (1, 8, 16):
            config = default_config(problem, H200, rows)
            assert config.cache == "registers" and config.cluster == 8, (problem, config.label())
            # fp32 27656 is 4 vectors a thread at 256 threads and 2 at 512: 512, as for
            # skewed rows; bf16 27656 is 2 and 1: 256.
            wide = problem.hidden % problem.max_vec or problem.itemsize == 4
            assert config.threads == (512 if wide else 256), (problem, config.label())
            assert derive_plan(config, problem, H200).shape.ragged
            assert check(config, problem) == []
        assert default_config(problem, H200, 17).cluster < 8  # 17 x 8 blocks outnumber the SMs
    # Rows the bulk kernel splits keep its split; short rows keep one block.
    assert default_config(Problem(32768, "float32"), H200, 1).cache == "bulk"
    assert default_config(Problem(6001, "float32"), H200, 1).cluster == 1
    assert default_config(Problem(26531, "float32"), A100, 1).cluster == 1


def test_fp32_layer_norm_rows_split_at_512_threads_where_that_fuses_their_sums():
    # 256 threads hold 20004 and 27656 at 3 and 4 vectors a thread (two reductions, each a
    # cluster barrier); 512 at 2, where the row takes one and its weights load beside x.
    # 12292 is at 2 vectors already, 49160 at 4 even with 512 (7 with 256): both keep 256.
    for hidden, threads in ((12292, 256), (20004, 512), (27656, 512), (49160, 256)):
        problem = Problem(hidden, "float32")
        config = default_config(problem, H200, 1)
        assert (config.threads, config.cluster) == (threads, 8), (hidden, config.label())
        plan = derive_plan(config, problem, H200)
        assert plan.fused_passes == plan.early_affine == (plan.shape.iters <= 2), hidden
        assert plan.fused_passes == (hidden != 49160), hidden


def _split_iters(problem, threads: int) -> int:  # noqa: ANN001
    config = KernelConfig(threads, problem.max_vec, 1, "registers", "two_pass", 8, 0)
    return derive_plan(config, problem, H200).shape.iters


@pytest.mark.parametrize(("problem", "threads"), [
    # 4 vectors a thread at 256 threads, 2 at 512: 512 (16-bit 49160 x1.09-1.13, fp32
    # LayerNorm after the add 27656 x1.16-1.18, fp32 RMSNorm 27656 x1.02-1.03, H100)
    (Problem(49160, "bfloat16"), 512),
    (Problem(49160, "float16", residual=True), 512),
    (RmsProblem(65528, "bfloat16"), 512),
    (Problem(27656, "float32", residual=True), 512),
    (RmsProblem(24584, "float32", residual=True), 512),
    (RmsProblem(27656, "float32"), 512),
    # 3 to 2 (the add at 20004 x0.98-1.00) and 2 to 1 (bf16 27656 x0.87) keep 256; so do rows
    # that 512 threads hold at more than 2 (fp32 49160: 7 vectors at 256 threads, 4 at 512)
    (Problem(20004, "float32", residual=True), 256),
    (RmsProblem(20004, "float32"), 256),
    (Problem(32776, "bfloat16"), 256),
    (Problem(27656, "bfloat16", residual=True), 256),
    (RmsProblem(49160, "float32"), 256),
    (Problem(49160, "float32", residual=True), 256),
])
def test_other_rows_split_at_512_threads_where_that_halves_a_long_chain(problem, threads):  # noqa: ANN001
    config = default_config(problem, H200, 1)
    assert (config.threads, config.cluster, config.cache) == (threads, 8, "registers"), (
        problem, config.label())
    assert derive_plan(config, problem, H200).shape.ragged
    at_256, at_512 = _split_iters(problem, 256), _split_iters(problem, 512)
    assert (at_256 >= few_rows.SPLIT_512_MIN_ITERS and at_512 <= 2) == (threads == 512), (
        at_256, at_512)
    assert default_config(problem, H200, 8) == config


def test_skewed_rows_up_to_64_kb_take_the_unclustered_bulk_kernel():
    # Odd rows of 16 KB and up stage their tiles' aligned spans (bf16 26531: 58.3% of copy
    # against the row kernel's 49.3%, fp32 4097 at 16 KB: 66-88% against 37.6%; H200).
    for problem, rows in ((Problem(16385, "bfloat16"), 4096), (Problem(26531, "bfloat16"), 2529),
                          (Problem(4097, "float32"), 16380)):
        config = default_config(problem, H200, rows)
        assert config.cache == "bulk" and config.cluster == 1, (problem, rows, config.label())
        assert derive_plan(config, problem).shape.skewed
        assert check(config, problem) == []


def test_many_skewed_rows_from_4_kb_take_the_bulk_kernel_at_two_stages():
    # At 36 rows an SM and more, skewed rows of 4-64 KB run the unclustered bulk kernel, where
    # aligned rows under 16 KB keep the row kernel.
    for dtype, hidden in (("bfloat16", 2053), ("bfloat16", 4099), ("float16", 9001),
                          ("float32", 1025), ("float32", 6001)):
        problem = Problem(hidden, dtype)
        rows = (1 << 26) // hidden
        config = default_config(problem, H200, rows)
        assert (config.cache, config.cluster, config.stages) == ("bulk", 1, 2), config.label()
        assert derive_plan(config, problem).shape.skewed
        assert check(config, problem) == []
        aligned = Problem(hidden // problem.max_vec * problem.max_vec, dtype)
        if aligned.hidden * aligned.itemsize < bulk_picks.BULK_MIN_ROW_BYTES:
            assert default_config(aligned, H200, rows).cache != "bulk"
    # Under 4 KB (but for the 16-bit rows the bulk kernel tiles), and with fewer rows, the row
    # kernel stays.
    assert default_config(Problem(1001, "float32"), H200, 1 << 16).cache != "bulk"
    assert default_config(Problem(1001, "bfloat16"), H200, 4096).cache != "bulk"
    assert default_config(Problem(4099, "bfloat16"), H200, 4096).cache != "bulk"


@pytest.mark.parametrize(("dtype", "hidden"), [
    ("bfloat16", 4099), ("float16", 8191), ("float32", 2051), ("float32", 8191),
])
def test_skewed_rms_rows_after_the_add_take_one_stage(dtype, hidden):
    # RMSNorm after the add ran x1.00-1.10 at one stage against two; LayerNorm after the add
    # keeps two.
    rows = (1 << 26) // hidden
    added = RmsProblem(hidden, dtype, residual=True)
    config = default_config(added, H200, rows)
    assert (config.cache, config.cluster, config.stages) == ("bulk", 1, 1), config.label()
    assert derive_plan(config, added).shape.skewed
    assert check(config, added) == []
    layer = default_config(Problem(hidden, dtype, residual=True), H200, rows)
    assert (layer.cache, layer.stages) == ("bulk", 2), layer.label()
    assert default_config(RmsProblem(hidden, dtype), H200, rows).stages == 2


def test_the_bulk_threads_count_a_skewed_rows_extra_vector():
    # bf16 8191 spans 1,025 vectors, one past 128 threads x 8: the rule takes 256 threads.
    config = default_config(Problem(8191, "bfloat16"), H200, 8193)
    assert (config.cache, config.threads) == ("bulk", 256), config.label()
    assert check(config, Problem(8191, "bfloat16")) == []


def test_the_latency_split_needs_rows_of_32_kb():
    for dtype in DTYPES:
        itemsize = Problem(1, dtype).itemsize
        below = Problem(24 * 1024 // itemsize, dtype)
        assert default_config(Problem(64 * 1024 // itemsize, dtype), H200, 1).cluster == 8
        assert default_config(below, H200, 1).cluster == 1
        assert heuristic.latency_configs(below, 1)  # a seed still, not the default
    # At 32 KB the split keeps the rows that the few-row shape gives 512 threads: 16-bit, and
    # fp32 LayerNorm's fused add (whose early loads would hold 128 registers' worth at 256).
    for dtype in ("bfloat16", "float16"):
        assert default_config(Problem(16384, dtype), H200, 1).cluster == 8
    assert default_config(Problem(8192, "float32", residual=True), H200, 8).cluster == 8
    assert default_config(Problem(8192, "float32"), H200, 1).label() == (
        "t256v4r1-registers-two_pass-c1-p0-e")


@pytest.mark.parametrize(("dtype", "hidden", "rows", "shape"), [
    ("bfloat16", 490, 1, "t128v2r1"),  # pairs divide the row: 245 of them over 128 threads
    ("float16", 1001, 64, "t256v2r1"),  # odd: skewed pairs
    ("float32", 1001, 256, "t256v2r1"),
    ("bfloat16", 2053, 1, "t512v4r1"),  # pairs would need 1,024 threads: fours
    ("bfloat16", 2053, 256, "t256v8r1"),  # more rows than SMs: 256 threads at most
    ("float32", 1072, 256, "t256v4r1"),
    ("bfloat16", 4096, 128, "t256v8r1"),
])
def test_a_few_short_rows_take_a_block_each_at_two_vectors_a_thread(dtype, hidden, rows, shape):
    problem = Problem(hidden, dtype)
    config = default_config(problem, H200, rows)
    assert config.label() == f"{shape}-registers-two_pass-c1-p0"
    plan = derive_plan(config, problem)
    assert plan.shape.iters <= 2 and plan.early_affine
    assert heuristic.few_rows_config(problem, rows_bucket(rows)) == config


@pytest.mark.parametrize(("family", "dtype", "hidden", "rows", "shape"), [
    ("layer", "bfloat16", 490, 1, "t128v2r1"),
    ("rms", "float16", 1024, 8, "t64v8r1"),
    ("rms", "float32", 2048, 64, "t256v4r1"),
    ("layer", "bfloat16", 4096, 256, "t256v8r1"),
])
def test_the_residual_add_takes_the_few_row_shape_with_its_early_weights(
    family, dtype, hidden, rows, shape
):
    problem = (Problem if family == "layer" else RmsProblem)(hidden, dtype, residual=True)
    config = default_config(problem, H200, rows)
    assert config.label() == f"{shape}-registers-two_pass-c1-p0"
    assert derive_plan(config, problem).early_affine
    wide = dataclasses.replace(problem, residual_dtype="float32") if dtype != "float32" else None
    if wide is not None:
        assert not derive_plan(config, wide).early_affine


@pytest.mark.parametrize(("dtype", "hidden", "rows", "label"), [
    # 256 threads at 3-8 vectors, the weights loaded beside x
    ("float32", 3072, 1, "t256v4r1-registers-two_pass-c1-p0-e"),
    ("float32", 4096, 64, "t256v4r1-registers-two_pass-c1-p0-e"),
    ("float32", 8192, 256, "t256v4r1-registers-two_pass-c1-p0-e"),
    ("bfloat16", 8192, 1, "t256v8r1-registers-two_pass-c1-p0-e"),
    ("float16", 6144, 256, "t256v8r1-registers-two_pass-c1-p0-e"),
    # 16-bit past 4 vectors at 256 threads: 512, no early loads, while a block an SM holds
    # every row
    ("bfloat16", 12288, 8, "t512v8r1-registers-two_pass-c1-p0"),
    ("bfloat16", 16384, 64, "t512v8r1-registers-two_pass-c1-p0"),
    # off the vector grid: no early loads; past a skewed cache's 4 vectors, 512 threads
    ("float16", 6001, 1, "t256v8r1-registers-two_pass-c1-p0"),
    ("float32", 4095, 64, "t512v4r1-registers-two_pass-c1-p0"),
    ("bfloat16", 8191, 128, "t512v8r1-registers-two_pass-c1-p0"),
])
def test_a_few_long_rows_take_256_threads_with_early_weights(dtype, hidden, rows, label):
    problem = Problem(hidden, dtype)
    config = default_config(problem, H200, rows)
    assert config.label() == label
    assert heuristic.few_rows_config(problem, rows_bucket(rows)) == config
    plan = derive_plan(config, problem)
    assert plan.shape.iters > 2
    assert plan.early_affine == config.early
    assert plan.lean_fp32 == (config.early and dtype == "float32")


@pytest.mark.parametrize(("op", "dtype", "hidden", "label"), [
    # rows of 3 x 2^k vectors: 2^k threads of three vectors, the weights loaded early
    ("layer_norm", "bfloat16", 3072, "t128v8r1-registers-two_pass-c1-p0-e"),
    ("rms_norm", "float32", 768, "t64v4r1-registers-two_pass-c1-p0-e"),
    ("add_rms_norm", "float32", 1536, "t128v4r1-registers-two_pass-c1-p0-e"),
    # 16-bit up to 128 threads of 8-byte vectors: three of those; RMSNorm without the add two
    # rows a block
    ("add_rms_norm", "bfloat16", 768, "t64v4r1-registers-two_pass-c1-p0-e"),
    ("add_layer_norm", "float16", 1536, "t128v4r1-registers-two_pass-c1-p0-e"),
    ("layer_norm", "float16", 768, "t64v4r1-registers-two_pass-c1-p0-e"),
    ("rms_norm", "bfloat16", 768, "t128v4r2-registers-two_pass-c1-p0-e"),
    ("rms_norm", "float16", 1536, "t256v4r2-registers-two_pass-c1-p0-e"),
    # where three vectors lost: 16-bit RMSNorm without the add past 128 threads of 8-byte
    # vectors, fp32 LayerNorm after the add
    ("rms_norm", "bfloat16", 3072, "t256v8r1-registers-two_pass-c1-p0"),
    ("add_layer_norm", "float32", 768, "t128v4r1-registers-two_pass-c1-p0"),
    # not three powers of two of vectors (1280: 5 x 32), no affine to load early
    ("layer_norm", "bfloat16", 1280, "t128v8r1-registers-two_pass-c1-p0"),
])
def test_rows_of_three_powers_of_two_vectors_take_three_a_thread(op, dtype, hidden, label):
    from autonorm.ops import registry

    family = registry.get(op.removeprefix("add_"))
    problem = family.problem(hidden=hidden, dtype=dtype, residual=op.startswith("add_"))
    for rows in (1, 64, 256):
        assert family.default(problem, H200, rows).label() == label
    bare = family.problem(hidden=hidden, dtype=dtype, residual=op.startswith("add_"),
                          has_weight=False, **({"has_bias": False} if op.endswith("layer_norm")
                                               else {}))
    assert not family.default(bare, H200, 1).early


@pytest.mark.parametrize(("op", "hidden", "rows", "threads"), [
    # fp32 after the add, past 4 vectors a thread at 256 threads: 512 from 64 rows while a
    # block an SM holds every row, where 512 threads divide the row's vectors
    ("add_rms_norm", 8192, 64, 512),
    ("add_rms_norm", 6144, 128, 512),
    ("add_layer_norm", 6144, 64, 512),
    ("add_rms_norm", 8192, 8, 256),    # under 64 rows
    ("add_rms_norm", 8192, 256, 256),  # more rows than SMs
    ("add_rms_norm", 5120, 64, 256),   # 1280 vectors: 512 threads' last pass half empty
    ("add_rms_norm", 4096, 64, 256),   # 4 vectors a thread at 256
    ("rms_norm", 8192, 64, 256),       # no add
])
def test_a_few_long_fp32_rows_after_the_add_take_512_threads(op, hidden, rows, threads):
    from autonorm.ops import registry

    family = registry.get(op.removeprefix("add_"))
    problem = family.problem(hidden=hidden, dtype="float32", residual=op.startswith("add_"))
    config = family.default(problem, H200, rows)
    assert (config.threads, config.vec, config.cache, config.early) == (
        threads, 4, "registers", True)


def test_early_loads_stop_at_96_registers_worth_a_thread():
    # LayerNorm's fused add at fp32 8192: x, residual, weight and bias of 8 vectors a thread
    # at 256 threads (128 words): 512 threads at 4, then none past the SMs.
    few = heuristic.few_rows_config
    added = Problem(8192, "float32", residual=True)
    assert few_rows._early_words(added, 32) == 128
    assert few(added, 64).label() == "t512v4r1-registers-two_pass-c1-p0-e"
    assert few(added, 256) is None
    assert few(Problem(8192, "float32"), 256).early  # 96 words: x, weight and bias


def test_the_few_row_shape_keeps_to_its_bounds():
    few = heuristic.few_rows_config
    # Over 256 rows, over 32 KB a row, 16-bit rows of 512 threads over the SMs, a float32
    # residual beside 16-bit x, rows too short for 64 threads: the rule's other branches decide
    assert few(Problem(490, "bfloat16"), 512) is None
    assert default_config(Problem(488, "bfloat16"), H200, 512) == row_kernel_default(
        Problem(488, "bfloat16"))
    assert few(Problem(16385, "bfloat16"), 1) is None
    assert few(Problem(8193, "float32"), 1) is None
    assert few(Problem(16384, "bfloat16"), 256) is None
    assert few(Problem(8192, "bfloat16", residual=True, residual_dtype="float32"), 1) is None
    assert few(Problem(490, "bfloat16", residual=True, residual_dtype="float32"), 1) is None
    assert few(Problem(200, "bfloat16"), 1) is None
    # Before Hopper the row kernel's default stays (the shape was timed on an H200 only)
    assert default_config(Problem(490, "bfloat16"), A100, 1) == row_kernel_default(
        Problem(490, "bfloat16"), A100)


def test_seeds_start_with_the_default_and_keep_the_row_kernels_neighbourhood():
    for problem, rows in ((Problem(16384, "bfloat16"), 4096), (Problem(20000, "float32"), 3355),
                          (Problem(16384, "float16"), 1), (Problem(768, "bfloat16"), 87381)):
        seeds = space.seed_configs(problem, H200, rows)
        assert seeds[0] == default_config(problem, H200, rows)
        assert row_kernel_default(problem) in seeds
        # Every seed of a search without a row count is there, whatever the rule picked.
        assert set(space.seed_configs(problem)) <= set(seeds)
        assert len(set(seeds)) == len(seeds)
        assert all(check(s, problem) == [] for s in seeds)
    assert space.seed_configs(Problem(4096))[0] == row_kernel_default(Problem(4096))


def test_the_row_kernels_default_is_the_untuned_kernel_before_the_rule():
    # Pinned: the benchmark compares the rule against it (docs/tuning.md).
    assert row_kernel_default(Problem(4096, "bfloat16")) == KernelConfig(
        128, 8, 1, "smem", "two_pass", 1, 0, 0, 64)
    assert row_kernel_default(Problem(16384, "float32")) == KernelConfig(
        1024, 4, 1, "smem", "two_pass", 1, 0)


def test_many_fp32_rows_of_8_to_24_kb_take_the_bulk_kernel_at_two_stages():
    # fp32 LayerNorm 3556 and 4360 left their tuned speed (the row kernel 70.1%, four stages
    # 76.7% on the H200); on an H100 two stages ran 97.4-99.6% at 2048-6144.
    for hidden, threads in ((2048, 128), (3556, 128), (4360, 256), (6144, 256)):
        problem = Problem(hidden, "float32")
        config = default_config(problem, H200, (1 << 26) // hidden)
        assert (config.cache, config.threads, config.stages, config.cluster) == (
            "bulk", threads, 2, 1), config.label()
        assert check(config, problem) == []
        # fewer rows keep the row kernel
        assert default_config(problem, H200, 1024).cache != "bulk"
    # 16-bit rows, RMSNorm and the residual add keep their rules (not timed so)
    assert default_config(Problem(3560, "bfloat16"), H200, 18850).cache != "bulk"
    assert default_config(Problem(3556, "float32", residual=True), H200, 18872).cache != "bulk"
    assert default_config(RmsProblem(3556, "float32"), H200, 18872).cache != "bulk"
    # 24 KB and more keep the staged rule: 8192 at three stages
    assert default_config(Problem(8192, "float32"), H200, 8192).stages == 3


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("hidden", [410, 490, 506])
def test_many_short_skewed_16_bit_rows_load_their_weights_early(dtype, hidden):
    # The row kernel's default, with weight and bias loaded beside x; longer rows (32 threads a
    # row and more), RMSNorm, the residual add, the forms without weight or bias, rows on the
    # vector grid and fp32 keep it as it is (only the timed form changed).
    # Fewer rows than 36 an SM: more take the bulk kernel's tiles (below).
    rows = 4096
    config = default_config(Problem(hidden, dtype), H200, rows)
    assert config.cache == "registers" and config.early, config.label()
    tiled = default_config(Problem(hidden, dtype), H200, (1 << 26) // hidden)
    # 52-64 aligned vectors: a warp a row in the bulk kernel's tiles at many rows
    assert (tiled.cache, tiled.threads, tiled.rows_per_block) == ("bulk", 256, 8), tiled.label()
    longer = default_config(Problem(2 * hidden + 1, dtype), H200, rows // 2)
    assert longer.threads_per_row == 32 and not longer.early, longer.label()
    rms = registry.get("rms_norm")
    assert not rms.default(rms.problem(hidden=hidden, dtype=dtype), H200, rows).early
    for form in ({"residual": True}, {"has_bias": False}, {"has_weight": False}):
        other = default_config(Problem(hidden, dtype, **form), H200, rows)
        assert not other.early, (form, other.label())
    assert dataclasses.replace(config, early=False) == dataclasses.replace(
        row_kernel_default(Problem(hidden, dtype)), keep_x=config.keep_x)
    aligned = hidden // 8 * 8
    assert not default_config(Problem(aligned, dtype), H200, (1 << 26) // aligned).early
    assert not default_config(Problem(hidden, "float32"), H200, rows).early


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize(("hidden", "shapes"), [
    (1032, {"layer": (64, 1), "rms": (64, 1)}),
    (1072, {"layer": (64, 1), "rms": (64, 1)}),
    (1536, {"layer": (64, 1), "rms": (64, 1)}),
    (2048, {"layer": (64, 1), "rms": (64, 1)}),
    # Off the vector grid: LayerNorm's tiles of the bulk kernel, 4 rows of 64 threads;
    # RMSNorm's a warp a row with the row in shared memory.
    (1025, {"layer": (256, 4, "bulk"), "rms": (128, 4, "smem")}),
    (1333, {"layer": (256, 4, "bulk"), "rms": (128, 4, "smem")}),
    (2042, {"layer": (256, 4, "bulk"), "rms": (128, 4, "smem")}),
    # A span past 256 vectors: 2 rows of 128 threads a tile, every norm.
    (2046, {"layer": (256, 2, "bulk"), "rms": (256, 2, "bulk")}),
    (2047, {"layer": (256, 2, "bulk"), "rms": (256, 2, "bulk")}),
])
def test_many_16_bit_rows_of_64_threads_run_one_a_block_or_skewed_in_tiles(
    op, dtype, hidden, shapes
):
    # 129-256 vectors: 64 threads a row, one row a 64-thread block, not two a 128-thread one;
    # off the vector grid (2-4 KB) the bulk kernel's tiles or a warp a row.
    family = registry.get(op)
    for residual in (False, True):
        problem = family.problem(hidden=hidden, dtype=dtype, residual=residual)
        config = family.default(problem, H200, (1 << 26) // hidden)
        picked = (config.threads, config.rows_per_block, config.cache)
        shape = shapes[problem.norm]
        assert picked[:len(shape)] == shape, config.label()
        assert (bulk_picks.skewed_tile(problem) is not None) == (config.cache == "bulk")
        assert check(config, problem, H200) == []
        if config.cache == "bulk":
            assert (config.stages, config.cluster, config.keep_x) == (2, 1, True), config.label()
            assert derive_plan(config, problem).shape.iters <= 4
            # Fewer rows than 36 an SM keep the row kernel's warp a row.
            fewer = family.default(problem, H200, 2048)
            assert (fewer.threads, fewer.rows_per_block, fewer.cache) == (128, 4, "smem")
        assert row_kernel_default(problem).rows_per_block == 2  # the rule before Hopper keeps it
    # A float32 residual beside 16-bit x (untimed in tiles) keeps the rule before them.
    wide = family.problem(hidden=hidden, dtype=dtype, residual=True, residual_dtype="float32")
    assert bulk_picks.skewed_tile(wide) is None
    assert family.default(wide, H200, (1 << 26) // hidden).rows_per_block == 1
    # 65-128 vectors keep a warp a row, four rows a block, on the vector grid; off it, two rows
    # of 64 threads a tile of the bulk kernel at one stage. fp32 rows of 4 KB and more that are
    # skewed take the bulk kernel
    shorter = default_config(Problem(1000 + hidden % 8, dtype), H200, 1 << 16)
    expected = (128, 2, 1) if hidden % 8 else (128, 4, 0)
    assert (shorter.threads, shorter.rows_per_block, shorter.stages) == expected, shorter.label()
    if hidden % 4:
        fp32 = default_config(Problem(hidden, "float32"), H200, (1 << 26) // hidden)
        assert fp32.cache == "bulk", fp32.label()


WARP, PAIR, QUAD = (256, 8), (128, 2), (256, 4)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize(("hidden", "tiles"), [
    # hidden (aligned vectors spanned): LayerNorm, after the add; RMSNorm, after the add
    (255, (None, None, None, None)),    # 33: the row kernel
    (292, (None, None, None, None)),    # 37
    (293, (None, WARP, None, None)),    # 38: a warp a row after the add
    (388, (None, WARP, None, None)),    # 49
    (389, (WARP, WARP, WARP, None)),    # 50
    (395, (WARP, PAIR, WARP, None)),    # 51: 64 threads a row after the add
    (484, (WARP, PAIR, WARP, None)),    # 61
    (483, (WARP, PAIR, WARP, QUAD)),    # 62: RMSNorm after the add, 4 rows of 64 threads
    (652, (WARP, PAIR, WARP, QUAD)),    # 82
    (651, (WARP, PAIR, PAIR, QUAD)),    # 83: RMSNorm 64 threads a row
    (850, (WARP, PAIR, PAIR, QUAD)),    # 107
    (851, (WARP, PAIR, PAIR, None)),    # 108: RMSNorm after the add, the row kernel
    (924, (WARP, PAIR, PAIR, None)),    # 116
    (923, (PAIR, PAIR, PAIR, None)),    # 117: LayerNorm 64 threads a row
    (1013, (PAIR, PAIR, PAIR, None)),
    (1023, (PAIR, PAIR, PAIR, None)),
])
def test_many_short_skewed_16_bit_rows_run_in_bulk_tiles_at_one_stage(dtype, hidden, tiles):
    # Up to 2 KB, by norm and residual add (SHORT_TILE_RULES; a float32 residual beside 16-bit
    # x aside): a warp a row, 8 rows a 256-thread tile; 64 threads a row, 2 rows a 128-thread
    # tile or 4 a 256-thread one; one stage. Fewer than 36 rows an SM, fp32 and rows on the
    # vector grid keep the row kernel; the forms without weight or bias take their norm's.
    rows = (1 << 26) // hidden
    expected = dict(zip([("layer_norm", False), ("layer_norm", True), ("rms_norm", False),
                         ("rms_norm", True)], tiles, strict=True))
    for (op, residual), tile in expected.items():
        family = registry.get(op)
        forms = [{}, {"has_weight": False}] + ([{"has_bias": False}] if op == "layer_norm" else [])
        for form in forms:
            problem = family.problem(hidden=hidden, dtype=dtype, residual=residual, **form)
            config = family.default(problem, H200, rows)
            if tile is None:
                assert config.cache != "bulk" and bulk_picks.skewed_tile(problem) is None
                continue
            assert (config.threads, config.rows_per_block) == tile, (form, config.label())
            assert (config.cache, config.stages, config.cluster) == ("bulk", 1, 1), config.label()
            assert config.threads // config.rows_per_block == (32 if tile == WARP else 64)
            assert check(config, problem, H200) == []
            assert derive_plan(config, problem).shape.skewed
            assert family.default(problem, H200, 4096).cache != "bulk"
        if residual:
            wide = family.problem(hidden=hidden, dtype=dtype, residual=True,
                                  residual_dtype="float32")
            assert bulk_picks.skewed_tile(wide) is None
            assert family.default(wide, H200, rows).cache != "bulk"
        fp32 = family.problem(hidden=hidden, dtype="float32", residual=residual)
        assert family.default(fp32, H200, rows).cache != "bulk"
        aligned = family.problem(hidden=hidden // 8 * 8, dtype=dtype, residual=residual)
        assert family.default(aligned, H200, (1 << 26) // aligned.hidden).cache != "bulk"
