"""Tests of the LayerNorm search space: validity rules, plans, enumeration, defaults. CPU only."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from autonorm.dtypes import DTYPES, normalize_dtype
from autonorm.errors import ConfigError
from autonorm.ops import layer_norm as space
from autonorm.ops.base import rows_bucket
from autonorm.ops.layer_norm import rules
from autonorm.ops.layer_norm.config import CLUSTERS, ROWS_PER_BLOCK, THREADS, KernelConfig
from autonorm.ops.layer_norm.heuristic import few_rows_config
from autonorm.ops.layer_norm.plan import derive_plan, min_blocks_per_sm, smem_bytes
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.rules import check, is_valid, require_valid
from autonorm.ops.layer_norm.shape import derive_shape
from autonorm.ops.layer_norm.space import default_config, enumerate_space, iter_space
from autonorm.runtime.limits import H200, DeviceLimits

BF16_4096 = Problem(4096, "bfloat16")


def reasons_of(config: KernelConfig, problem: Problem, device: DeviceLimits = H200, **kw) -> str:
    return "; ".join(check(config, problem, device, **kw))


def assert_rejected(
    config: KernelConfig, problem: Problem, needle: str, device: DeviceLimits = H200, **kw
) -> None:
    reasons = check(config, problem, device, **kw)
    assert reasons, f"{config.label()} on {problem} should be rejected ({needle!r})"
    assert any(needle in r for r in reasons), f"no reason names {needle!r}: {reasons}"
    assert not is_valid(config, problem, device)


def assert_accepted(
    config: KernelConfig, problem: Problem, device: DeviceLimits = H200, **kw
) -> None:
    assert check(config, problem, device, **kw) == [], config.label()


# --------------------------------------------------------------------------- validity rules


def test_vector_wider_than_16_bytes_rejected():
    fp32 = Problem(4096, "float32")
    bad = KernelConfig(threads=256, vec=8, cache="registers", stats="welford")
    assert_rejected(bad, fp32, "exceeds a 16-byte access")
    assert_accepted(dataclasses.replace(bad, vec=4), fp32)
    # the same vec is a 16-byte access for 2-byte types
    assert_accepted(bad, Problem(4096, "float16"))
    assert_accepted(bad, BF16_4096)


def test_vec_not_dividing_hidden_reads_rows_skewed():
    # 1004 = 4 x 251: 16-byte vectors do not tile a row, so rows start off the vector grid. The
    # row kernel and the bulk kernel read them skewed (a cluster of the bulk kernel in runs of
    # the row's aligned vectors, as the row kernel's, but not with the residual add); a
    # prefetching kernel refuses them.
    problem = Problem(1004, "bfloat16")
    skewed = KernelConfig(threads=128, vec=8, cache="smem", stats="welford")
    assert_accepted(skewed, problem)
    plan = derive_plan(skewed, problem)
    assert plan.shape.skewed and not plan.shape.even
    assert plan.shape.vectors == 126  # ceil((1004 + 7) / 8): a row spans one vector more
    assert not derive_plan(dataclasses.replace(skewed, vec=4), problem).shape.skewed
    bulk = KernelConfig(128, 8, 1, "bulk", "two_pass", 1, 0, 2)
    assert_accepted(bulk, problem)
    assert derive_plan(bulk, problem).shape.skewed
    split = KernelConfig(128, 8, 1, "bulk", "two_pass", 2, 0, 2)
    problem_4k = Problem(4100, "bfloat16")  # runs of 257 vectors: the last block 256 or 257
    assert_accepted(split, problem_4k)
    shape = derive_plan(split, problem_4k).shape
    assert shape.ragged and shape.vectors == 257 and shape.segment == 257 * 8
    assert_rejected(split, Problem(4100, "bfloat16", residual=True),
                    "skewed rows over a cluster without the residual add")
    # a cluster of 8 over 16004's 2001 vectors at most: runs of 251, the last block's 243-244
    big = KernelConfig(128, 8, 1, "bulk", "two_pass", 8, 0, 2)
    assert_accepted(big, Problem(16004, "bfloat16"))
    assert derive_plan(big, Problem(16004, "bfloat16")).shape.vectors == 251
    assert_rejected(KernelConfig(128, 8, 1, "registers", "two_pass", 1, 4), problem,
                    "a prefetching kernel")
    # The row kernel's cluster deals the row's 126 aligned vectors out in runs of 63.
    ragged = KernelConfig(32, 8, 1, "smem", "two_pass", 2, 0)
    assert_accepted(ragged, problem)
    assert derive_plan(ragged, problem).shape.ragged
    assert derive_plan(ragged, problem).shape.vectors == 63
    assert_rejected(KernelConfig(32, 8, 1, "smem", "two_pass", 4, 0), Problem(9, "bfloat16"),
                    "leaves its last block no vectors")


def test_skewed_rows_keep_clear_of_the_spills_nvcc_showed():
    # Under the 64-register cap, at 1024 threads and past 4 cached vectors a thread, skewed
    # kernels spilled (nvcc 13.0, sm_90); their aligned twins are unaffected.
    fp16 = Problem(4099, "float16")
    assert_rejected(KernelConfig(256, 8, 1, "registers", "two_pass", 1, 0, 0, 64), fp16,
                    "does not apply to skewed rows")
    assert_accepted(KernelConfig(256, 8, 1, "registers", "two_pass", 1, 0), fp16)
    assert_rejected(KernelConfig(1024, 8, 1, "smem", "two_pass", 1, 0), Problem(62012, "bfloat16"),
                    "1024-thread kernels spill on skewed rows")
    assert_rejected(KernelConfig(512, 8, 1, "registers", "two_pass", 1, 0),
                    Problem(25644, "float16"), "skewed register row cache of 7 vectors")
    assert_accepted(KernelConfig(256, 8, 1, "registers", "two_pass", 1, 0, 0, 64),
                    Problem(4096, "float16"))


def test_fp32_two_pass_runs_are_capped():
    # 8 threads a row at fp32 12289 (1,536 elements each) failed the outlier case on the H200.
    problem = Problem(12289, "float32")
    assert_rejected(KernelConfig(32, 4, 4, "smem", "two_pass", 1, 0), problem,
                    "fp32 two-pass over more than 512 elements per thread")
    assert_accepted(KernelConfig(128, 4, 1, "smem", "two_pass", 1, 0), problem)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [1, 7, 490, 1001, 3556, 26531, 40001, 65537])
def test_odd_sizes_default_to_full_width_vectors(hidden, dtype):
    problem = Problem(hidden, dtype)
    for rows in (None, 1, 64, max(1, 2**26 // hidden)):
        cfg = default_config(problem) if rows is None else default_config(problem, H200, rows)
        assert_accepted(cfg, problem)
        few = None if rows is None else few_rows_config(problem, rows_bucket(rows))
        if few is not None:  # a few short rows: two vectors a thread, of a width they set
            assert cfg == few, cfg.label()
            continue
        assert cfg.vec == problem.max_vec, cfg.label()  # 16-byte accesses, rows skewed
        if 1000 <= hidden <= 40001:
            assert cfg.cache != "none", cfg.label()  # a cached row: x is read once


def test_rows_per_block_not_dividing_threads_rejected(monkeypatch):
    # With the shipped tuples (powers of two, rows <= 32 <= threads) the rule cannot fire;
    # widen the allowed rows to reach it.
    monkeypatch.setattr(rules, "ROWS_PER_BLOCK", (*ROWS_PER_BLOCK, 3, 64))
    problem = Problem(64, "float32")
    for bad in (
        KernelConfig(threads=256, vec=1, rows_per_block=3, cache="smem", stats="welford"),
        KernelConfig(threads=32, vec=1, rows_per_block=64, cache="smem", stats="welford"),
    ):
        assert_rejected(bad, problem, "rows_per_block must divide threads")
    assert_accepted(
        KernelConfig(threads=256, vec=1, rows_per_block=4, cache="smem", stats="welford"), problem
    )


def test_shipped_rows_per_block_always_divide_threads():
    assert all(t % r == 0 for t in THREADS for r in ROWS_PER_BLOCK)


def test_two_pass_without_cache_rejected():
    bad = KernelConfig(threads=256, vec=8, cache="none", stats="two_pass")
    assert_rejected(bad, BF16_4096, "two_pass statistics re-read the row")
    assert_accepted(dataclasses.replace(bad, cache="registers"), BF16_4096)
    assert_accepted(dataclasses.replace(bad, cache="smem"), BF16_4096)
    assert_accepted(dataclasses.replace(bad, stats="welford"), BF16_4096)


def test_cluster_with_several_rows_per_block_rejected():
    problem = Problem(16384, "bfloat16")
    bad = KernelConfig(threads=256, vec=8, rows_per_block=2, cache="smem", stats="welford",
                       cluster=2)
    assert_rejected(bad, problem, "rows_per_block must be 1")
    assert_accepted(dataclasses.replace(bad, rows_per_block=1), problem)
    assert_accepted(dataclasses.replace(bad, cluster=1), problem)


def test_only_the_row_kernel_splits_rows_a_cluster_does_not_divide():
    problem = Problem(1000, "bfloat16")  # 1000 = 8 x 125: vec 8 fits, cluster 2 x vec 8 not
    ragged = KernelConfig(threads=64, vec=8, cache="smem", stats="welford", cluster=2)
    assert_accepted(ragged, problem)
    shape = derive_plan(ragged, problem).shape
    assert shape.ragged and not shape.even and shape.vectors == 63  # runs of 63 and 62
    assert shape.segment == 63 * 8  # the stride from one block's run to the next
    assert not derive_plan(dataclasses.replace(ragged, vec=4), problem).shape.ragged
    assert_rejected(KernelConfig(128, 8, 1, "bulk", "two_pass", 2, 0, 2), Problem(1096, "bfloat16"),
                    "bulk-copy kernel's cluster needs cluster x vec to divide hidden")


def test_ragged_runs_cover_every_row_and_leave_no_block_empty():
    # For every hidden size a few past each vector width and cluster, wherever check admits a
    # ragged split: the cluster's runs span the longest row any offset gives, and the last
    # block of the shortest row still holds a vector of it.
    rng = np.random.default_rng(0)
    hidden_sizes = sorted({*range(1, 40), *rng.integers(40, 70000, 60).tolist(), 27656})
    seen = 0
    for hidden in hidden_sizes:
        for dtype, vec, cluster in ((d, v, c) for d in DTYPES for v in (1, 2, 4, 8)
                                    for c in CLUSTERS[1:]):
            problem = Problem(int(hidden), dtype)
            config = KernelConfig(32, vec, 1, "smem", "two_pass", cluster, 0)
            if vec * problem.itemsize > 16 or check(config, problem):
                continue
            shape = derive_shape(config, problem)
            longest = -(-(hidden + shape.head) // vec)  # aligned vectors a row spans at most
            if not shape.ragged:
                assert hidden % (cluster * vec) == 0 and shape.segment * cluster == hidden
                continue
            seen += 1
            assert shape.segment == shape.vectors * vec
            assert cluster * shape.vectors >= longest, (hidden, dtype, vec, cluster)
            assert (cluster - 1) * shape.vectors < -(-hidden // vec), (hidden, dtype, vec, cluster)
    assert seen > 100


def test_cluster_needs_hopper():
    problem = Problem(16384, "bfloat16")
    cfg = KernelConfig(threads=256, vec=8, cache="smem", stats="welford", cluster=2)
    ampere = DeviceLimits(name="A100", cc=80, sm_count=108, max_smem_optin=166912)
    assert_rejected(cfg, problem, "compute capability 9.0", ampere)
    assert_accepted(dataclasses.replace(cfg, cluster=1), problem, ampere)
    assert_accepted(cfg, problem)


def test_register_cache_too_many_elements_rejected():
    problem = Problem(16384, "bfloat16")
    bad = KernelConfig(threads=128, vec=8, cache="registers", stats="two_pass")  # 16 x 8 elems
    assert_rejected(bad, problem, "register row cache of 16 vectors / 128 elements")
    assert_accepted(dataclasses.replace(bad, threads=256), problem)  # 8 x 8 = 64 elements
    assert_accepted(dataclasses.replace(bad, cache="smem"), problem)


def test_register_cache_too_many_vectors_rejected():
    problem = Problem(16384, "bfloat16")
    bad = KernelConfig(threads=512, vec=1, cache="registers", stats="two_pass")  # 32 vectors
    assert_rejected(bad, problem, "register row cache of 32 vectors")
    assert_accepted(dataclasses.replace(bad, vec=2), problem)  # 16 vectors x 2 = 32 elements


def test_register_cache_fp32_elements_capped_at_32():
    problem = Problem(16384, "float32")
    bad = KernelConfig(threads=256, vec=4, cache="registers", stats="two_pass")  # 16 x 4 = 64
    assert_rejected(bad, problem, "64 elements per thread (limits 16 / 32)")
    assert_accepted(dataclasses.replace(bad, threads=512), problem)  # 8 x 4 = 32


def test_fp32_welford_run_capped_at_2048_elements_per_thread():
    # The GPU fuzz test drew this on the H200: one thread per row runs Welford over 6,500 fp32
    # elements; the outlier-first case read 5.0e-6 against a 2e-6 tolerance (docs/accuracy.md).
    fuzzed = KernelConfig(threads=32, vec=1, rows_per_block=32, cache="none", stats="welford",
                          blocks_per_sm=2)
    assert_rejected(fuzzed, Problem(6500, "float32"), "welford over more than 2048 elements")
    assert_accepted(fuzzed, Problem(2048, "float32"))
    # 16-bit tolerances (1e-3 / 8e-3) keep the longer cap.
    assert_accepted(fuzzed, Problem(6500, "bfloat16"))
    assert_rejected(fuzzed, Problem(8200, "bfloat16"), "welford over more than 8192 elements")


def test_prefetching_register_cache_holds_half_the_vectors():
    # a persistent grid with a register cache keeps the next row too (space.prefetches)
    problem = Problem(4096, "float16")
    plain = KernelConfig(threads=256, vec=1, cache="registers", stats="welford")  # 16 vectors
    bad = dataclasses.replace(plain, blocks_per_sm=2)
    assert space.prefetches(bad) and not space.prefetches(plain)
    assert not space.prefetches(dataclasses.replace(bad, cache="smem"))
    assert_accepted(plain, problem)
    assert_rejected(bad, problem, "register row cache of 16 vectors / 16 elements per thread "
                                  "(limits 8 / 64)")
    assert_accepted(dataclasses.replace(bad, vec=2), problem)  # 8 vectors
    assert space.register_estimate(bad, problem) > space.register_estimate(plain, problem)


def test_register_cache_over_register_budget_rejected():
    # 1024 threads leave 64 registers each; an 8-element welford cache needs about 52 + margin.
    problem = Problem(8192, "bfloat16")
    bad = KernelConfig(threads=1024, vec=8, cache="registers", stats="welford")
    assert_rejected(bad, problem, "registers per thread; 1024 threads allow 64")
    assert_accepted(dataclasses.replace(bad, threads=512), problem)
    assert_accepted(dataclasses.replace(bad, cache="smem"), problem)


def test_shared_memory_over_device_limit_rejected():
    small = DeviceLimits(name="small", max_smem_optin=48 * 1024)
    problem = Problem(16384, "bfloat16")  # a row is 32 KiB
    bad = KernelConfig(threads=256, vec=8, rows_per_block=2, cache="smem", stats="welford")
    assert smem_bytes(bad, problem) > small.max_smem_optin
    assert_rejected(bad, problem, "bytes of shared memory (device opt-in limit 49152)", small)
    assert_accepted(dataclasses.replace(bad, rows_per_block=1), problem, small)
    assert_accepted(bad, problem)  # fits an H200


def test_naive_stats_need_allow_unstable():
    naive = KernelConfig(threads=256, vec=8, cache="registers", stats="naive")
    assert_rejected(naive, BF16_4096, "stats must be one of")
    assert_accepted(naive, BF16_4096, allow_unstable=True)
    with pytest.raises(ConfigError, match="stats must be one of"):
        require_valid(naive, BF16_4096)
    require_valid(naive, BF16_4096, allow_unstable=True)


def test_idle_threads_rejected():
    problem = Problem(768, "bfloat16")  # 96 vectors of 8
    bad = KernelConfig(threads=256, vec=8, cache="smem", stats="welford")
    assert_rejected(bad, problem, "over half the threads would idle")
    assert_accepted(dataclasses.replace(bad, threads=128), problem)


def test_welford_cluster_at_1024_threads_rejected():
    problem = Problem(65536, "bfloat16")
    bad = KernelConfig(threads=1024, vec=8, cache="smem", stats="welford", cluster=2)
    assert_rejected(bad, problem, "welford across a cluster spills at 1024 threads")
    assert_accepted(dataclasses.replace(bad, stats="two_pass"), problem)
    assert_accepted(dataclasses.replace(bad, threads=512), problem)


def test_uncached_rows_of_any_length_accepted():
    # The uncached loop is unrolled 4 deep, so row length costs neither compile time nor
    # registers: 2^23 / (1024 x 1) = 8192 vectors per thread is fine in 16-bit; fp32 Welford
    # runs stop at 2048 elements (accuracy, space.WELFORD_RUN_MAX).
    config = KernelConfig(threads=1024, vec=1, cache="none", stats="welford")
    assert_accepted(config, Problem(1 << 23, "bfloat16"))
    assert_accepted(config, Problem(1 << 21, "float32"))


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("threads", 48, "threads must be one of"),
        ("vec", 3, "vec must be one of"),
        ("rows_per_block", 3, "rows_per_block must be one of"),
        ("cache", "global", "cache must be one of"),
        ("stats", "kahan", "stats must be one of"),
        ("cluster", 16, "cluster must be one of"),
        ("blocks_per_sm", 3, "blocks_per_sm must be one of"),
    ],
)
def test_values_outside_the_space_rejected(field, value, needle):
    base = KernelConfig(threads=256, vec=8, cache="registers", stats="welford")
    assert_accepted(base, BF16_4096)
    assert_rejected(dataclasses.replace(base, **{field: value}), BF16_4096, needle)


def test_require_valid_names_every_reason():
    bad = KernelConfig(threads=256, vec=8, rows_per_block=2, cache="none", stats="two_pass",
                       cluster=2)
    with pytest.raises(ConfigError) as info:
        require_valid(bad, Problem(16384, "bfloat16"))
    message = str(info.value)
    assert bad.label() in message
    assert "rows_per_block must be 1" in message
    assert "two_pass statistics re-read the row" in message
    assert isinstance(info.value, ValueError)


# --------------------------------------------------------------------------- enumeration


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [1, 7, 768, 1000, 4096, 65536])
def test_enumeration_deterministic_and_valid(dtype, hidden):
    problem = Problem(hidden, dtype)
    configs = enumerate_space(problem)
    assert configs, "every problem has at least one valid configuration"
    assert configs == enumerate_space(problem)
    assert len(set(configs)) == len(configs)
    for cfg in configs:
        assert check(cfg, problem) == [], cfg.label()
        assert cfg.stats != "naive"
    # enumeration is exactly the valid subset of the raw space, in its order
    raw = list(iter_space())
    index = {c: i for i, c in enumerate(raw)}
    positions = [index[c] for c in configs]
    assert positions == sorted(positions)


A100_LIMITS = dataclasses.replace(H200, name="NVIDIA A100-SXM4-80GB", cc=80, sm_count=108)


@pytest.mark.parametrize(("op", "hidden", "dtype", "form"), [
    ("layer_norm", 4096, "bfloat16", {}),
    ("layer_norm", 12289, "float32", {}),
    ("layer_norm", 1000, "float16", {"residual": True}),
    ("rms_norm", 768, "float32", {"has_weight": False}),
    ("rms_norm", 65536, "bfloat16", {"residual": True}),
    ("rms_norm", 7, "float16", {}),
])
def test_the_space_is_every_raw_point_that_check_accepts(op, hidden, dtype, form):
    # The space skips whole branches of the raw space before checking them: what it keeps must
    # be exactly what check accepts of iter_space, in its order, with and without clusters and
    # bulk copy (compute capability 9.0 and 8.0).
    from autonorm.ops import registry

    problem = registry.get(op).problem(hidden=hidden, dtype=dtype, **form)
    raw = list(iter_space())
    for device in (H200, A100_LIMITS):
        accepted = [c for c in raw if not check(c, problem, device)]
        assert accepted
        assert enumerate_space(problem, device) == accepted


def test_iter_space_covers_the_product():
    raw = list(iter_space())
    shapes = len(THREADS) * len(space.VECS) * len(ROWS_PER_BLOCK) * len(CLUSTERS)
    other_caches = [c for c in space.CACHES if c != "bulk"]
    bulk_stages = [s for s in space.STAGES if s > 0]
    # The other kernels: every (cache, stats, blocks_per_sm, max_regs) with stages 0, x kept
    # in L2 or not. The bulk-copy kernel: two-pass statistics, an occupancy grid and no
    # register cap only, with every stage count >= 1, x kept in L2 or not.
    non_bulk = (shapes * len(other_caches) * len(space.STATS) * len(space.BLOCKS_PER_SM)
                * len(space.MAX_REGS) * 2)
    bulk = shapes * len(bulk_stages) * 2
    # Early weight loads: the register cache's, one block a row tile, uncapped, unclustered.
    early = len(THREADS) * len(space.VECS) * len(ROWS_PER_BLOCK) * len(space.STATS) * 2
    assert len(raw) == len(set(raw)) == non_bulk + bulk + early
    assert all(c.cache == "registers" and c.cluster == 1 and not c.blocks_per_sm
               and not c.max_regs for c in raw if c.early)
    assert raw == list(iter_space())
    assert {
        (c.threads, c.vec, c.rows_per_block, c.cache, c.stats, c.cluster, c.blocks_per_sm,
         c.max_regs)
        for c in raw
        if c.cache != "bulk"
    } == {
        (t, v, r, c, s, cl, p, m)
        for t in THREADS
        for v in space.VECS
        for r in ROWS_PER_BLOCK
        for c in other_caches
        for s in space.STATS
        for cl in CLUSTERS
        for p in space.BLOCKS_PER_SM
        for m in space.MAX_REGS
    }
    assert all(c.stages == 0 for c in raw if c.cache != "bulk")
    bulk_raw = [c for c in raw if c.cache == "bulk"]
    assert len(bulk_raw) == bulk
    assert {c.stats for c in bulk_raw} == {"two_pass"}
    assert {c.blocks_per_sm for c in bulk_raw} == {0}
    assert {c.max_regs for c in bulk_raw} == {0}
    assert {c.stages for c in bulk_raw} == set(bulk_stages)
    assert {(c.threads, c.vec, c.rows_per_block, c.cluster, c.stages) for c in bulk_raw} == {
        (t, v, r, cl, st)
        for t in THREADS
        for v in space.VECS
        for r in ROWS_PER_BLOCK
        for cl in CLUSTERS
        for st in bulk_stages
    }


def test_enumeration_respects_device_limits():
    small = DeviceLimits(name="small", max_smem_optin=48 * 1024)
    problem = Problem(16384, "bfloat16")
    big = enumerate_space(problem)
    little = enumerate_space(problem, small)
    assert set(little) < set(big)
    assert all(smem_bytes(c, problem) <= small.max_smem_optin for c in little)


def _primes(limit: int) -> list[int]:
    sieve = np.ones(limit + 1, dtype=bool)
    sieve[:2] = False
    for i in range(2, int(limit**0.5) + 1):
        if sieve[i]:
            sieve[i * i :: i] = False
    return [int(p) for p in np.flatnonzero(sieve)]


def _default_hidden_sizes() -> list[int]:
    sizes = set(range(1, 1025))  # every small size: odd, even, prime
    sizes.update(range(1025, 70001, 37))  # odd stride: alternating parity
    sizes.update(_primes(70000)[::25])
    for k in range(17):  # powers of two, their neighbours and 3 x 2^k
        for n in (1 << k, (1 << k) - 1, (1 << k) + 1, 3 << k):
            if 1 <= n <= 70000:
                sizes.add(n)
    sizes.update({768, 1000, 1536, 2048, 2560, 4096, 5120, 8192, 12288, 14336, 16384, 65536,
                  69997, 70000, 1 << 20, 3 << 20, (1 << 20) + 2, 1000003, 4 * 1000003})
    return sorted(sizes)


@pytest.mark.parametrize("dtype", DTYPES)
def test_default_config_valid_for_every_hidden_size(dtype):
    sizes = _default_hidden_sizes()
    assert {1, 2, 3, 65537, 1 << 20, 3 << 20} <= set(sizes)
    bad = []
    for hidden in sizes:
        problem = Problem(hidden, dtype)
        try:
            cfg = default_config(problem)
        except ConfigError as exc:
            bad.append((hidden, str(exc)))
            continue
        reasons = check(cfg, problem)
        if reasons or cfg.stats == "naive":
            bad.append((hidden, cfg.label(), reasons))
    assert not bad, bad[:10]


# Found by this test: no configuration existed for odd hidden > 2^22 (an iteration cap on
# cache "none"); the cap is gone: that loop is unrolled 4 deep, whatever the row length.
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_default_config_for_odd_hidden_beyond_4m(dtype):
    problem = Problem((1 << 22) + 1, dtype)
    assert check(default_config(problem), problem) == []


def test_odd_fp32_rows_past_the_welford_run_cap_get_a_clear_error():
    # fp32 Welford runs stop at 2048 elements per thread (accuracy). An odd row splits over a
    # cluster unevenly, of 512-thread blocks (1024 spill on skewed rows): 8 x 512 x 2048 =
    # 8,388,608 elements at most.
    for hidden in ((1 << 21) - 1, (1 << 22) + 1, (1 << 23) - 1):
        config = default_config(Problem(hidden, "float32"))
        assert check(config, Problem(hidden, "float32")) == [], hidden
    assert config.cluster == 8 and derive_plan(config, Problem(hidden, "float32")).shape.ragged
    with pytest.raises(ConfigError, match=r"at most 2,048 elements per thread.*8,388,609 "
                                          r"elements a cluster of 8 blocks holds too few"):
        default_config(Problem((1 << 23) + 1, "float32"))


def test_default_config_deterministic_and_prefers_a_cache():
    cfg = default_config(BF16_4096)
    assert cfg == default_config(BF16_4096)
    assert cfg.vec == 8
    # 4 vectors of 8 per thread: more than the cap's register cache holds, so shared memory
    assert cfg.cache == "smem" and cfg.max_regs == 64
    assert cfg.stats == "two_pass"
    assert cfg.cluster == 1 and cfg.blocks_per_sm == 0
    fp32 = default_config(Problem(4096, "float32"))
    assert fp32.cache == "registers" and fp32.max_regs == 0  # fp32 is never capped


def test_16_bit_default_takes_the_cap_where_check_admits_it():
    for dtype in ("bfloat16", "float16"):
        for hidden in (768, 1000, 1536, 2560, 5120, 11008, 16384, 40000):
            problem = Problem(hidden, dtype)
            cfg = default_config(problem)
            assert check(cfg, problem) == []
            uncapped = dataclasses.replace(cfg, max_regs=0)
            if cfg.max_regs:  # a capped register cache where the cap holds it, else smem
                assert cfg.cache in ("registers", "smem")
                if cfg.cache == "smem":
                    as_registers = dataclasses.replace(cfg, cache="registers")
                    assert check(as_registers, problem) != []
            else:  # the cap could not apply (e.g. a cluster for very long rows)
                assert check(dataclasses.replace(uncapped, max_regs=64), problem) != []


def test_default_config_respects_small_device():
    small = DeviceLimits(name="small", max_smem_optin=48 * 1024)
    for hidden in (16384, 65536, 1 << 20):
        problem = Problem(hidden, "bfloat16")
        assert check(default_config(problem, small), problem, small) == []


# --------------------------------------------------------------------------- helpers


@pytest.mark.parametrize(
    ("rows", "bucket"),
    [(-5, 1), (0, 1), (1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (1000, 1024), (1024, 1024),
     (1025, 2048), ((1 << 20) + 1, 1 << 21)],
)
def test_rows_bucket(rows, bucket):
    assert rows_bucket(rows) == bucket


def test_rows_bucket_is_power_of_two_upper_bound():
    for rows in range(1, 5000):
        b = rows_bucket(rows)
        assert b & (b - 1) == 0
        assert b >= rows
        assert b == 1 or b // 2 < rows


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        ("fp32", "float32"), ("f32", "float32"), ("float", "float32"), ("float32", "float32"),
        ("fp16", "float16"), ("f16", "float16"), ("half", "float16"), ("float16", "float16"),
        ("bf16", "bfloat16"), ("bfloat16", "bfloat16"), ("BF16", "bfloat16"),
        ("Float16", "float16"), ("torch.bfloat16", "bfloat16"), ("torch.float16", "float16"),
    ],
)
def test_normalize_dtype_aliases(alias, name):
    assert normalize_dtype(alias) == name


def test_normalize_dtype_objects():
    assert normalize_dtype(np.dtype("float32")) == "float32"
    assert normalize_dtype(np.dtype(np.float16)) == "float16"

    class FakeTorchDtype:
        def __str__(self) -> str:
            return "torch.bfloat16"

    assert normalize_dtype(FakeTorchDtype()) == "bfloat16"


@pytest.mark.parametrize("bad", ["float64", "int8", "fp8", "", np.dtype("float64"), None])
def test_normalize_dtype_rejects(bad):
    with pytest.raises(ValueError, match="unsupported dtype .*float32, float16 and bfloat16"):
        normalize_dtype(bad)


@pytest.mark.parametrize("hidden", [0, -1, -4096, 1.5, "4096", None])
def test_problem_rejects_bad_hidden(hidden):
    with pytest.raises(ValueError, match="hidden size must be a positive integer"):
        Problem(hidden)  # type: ignore[arg-type]


def test_problem_normalizes_and_is_frozen():
    p = Problem(1, "bf16")
    assert p.dtype == "bfloat16" and p.itemsize == 2
    assert p == Problem(1, "bfloat16") and hash(p) == hash(Problem(1, "bfloat16"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.hidden = 2  # type: ignore[misc]
    with pytest.raises(ValueError, match="unsupported dtype"):
        Problem(4096, "float64")


@pytest.mark.parametrize(
    ("hidden", "dtype", "vec"),
    [(4096, "float32", 4), (4096, "bfloat16", 8), (1000, "float16", 8), (1004, "float16", 4),
     (1002, "bfloat16", 2), (7, "float32", 1), (6, "float32", 2), (1, "bfloat16", 1)],
)
def test_problem_vectors(hidden, dtype, vec):
    problem = Problem(hidden, dtype)
    assert problem.aligned_vec == vec
    assert problem.max_vec == 16 // problem.itemsize  # odd sizes read skewed at full width


def test_kernel_config_round_trip_and_frozen():
    for cfg in list(iter_space())[::97]:
        data = cfg.to_dict()
        assert set(data) == {f.name for f in dataclasses.fields(KernelConfig)}
        assert KernelConfig.from_dict(data) == cfg
        assert KernelConfig.from_dict({**data, "unknown": 1, "score": 2.5}) == cfg
    cfg = KernelConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.threads = 128  # type: ignore[misc]
    assert {cfg: 1}[KernelConfig()] == 1
    assert KernelConfig.from_dict({}) == KernelConfig()


def test_kernel_config_label():
    cfg = KernelConfig(threads=128, vec=4, rows_per_block=2, cache="smem", stats="two_pass",
                       cluster=1, blocks_per_sm=4)
    assert cfg.label() == "t128v4r2-smem-two_pass-c1-p4"
    assert cfg.threads_per_row == 64
    labels = {c.label() for c in iter_space()}
    assert len(labels) == len(list(iter_space()))


def test_device_limits_arch():
    assert H200.arch == "sm_90"
    assert DeviceLimits(cc=100).arch == "sm_100"


def test_derive_shape():
    shape = derive_shape(KernelConfig(threads=256, vec=8, rows_per_block=2), Problem(1000, "bf16"))
    assert shape.segment == 1000
    assert shape.threads_per_row == 128
    assert shape.iters == 1  # 125 vectors over 128 threads
    assert not shape.even
    assert shape.cache_regs == 4
    assert shape.smem_cache_bytes == 2 * 1000 * 2
    cluster = derive_shape(KernelConfig(threads=256, vec=8, cluster=4), Problem(65536, "bf16"))
    assert cluster.segment == 16384 and cluster.iters == 8 and cluster.even


@pytest.mark.parametrize("dtype", DTYPES)
def test_min_blocks_per_sm_bounds(dtype):
    problem = Problem(4096, dtype)
    for cfg in enumerate_space(problem):
        m = min_blocks_per_sm(cfg, problem)
        assert 1 <= m <= 32
        assert m * cfg.threads <= H200.max_threads_per_sm or m == 1


# --- the register cap (max_regs) ---------------------------------------------------------------

BF16_768 = Problem(768, "bfloat16")
CAPPED_768 = KernelConfig(128, 8, 4, "registers", "two_pass", 1, 0, 0, 64)  # the A/B's 95.5%


def test_max_regs_caps_the_launch_bound_at_64_registers():
    assert check(CAPPED_768, BF16_768) == []
    uncapped = dataclasses.replace(CAPPED_768, max_regs=0)
    assert min_blocks_per_sm(uncapped, BF16_768) == 4  # the estimate's 128 registers
    blocks = min_blocks_per_sm(CAPPED_768, BF16_768)
    assert blocks == 8 and H200.regs_per_sm // (blocks * 128) == 64
    assert space.capped_blocks(uncapped) == 0
    for threads in THREADS:  # every block size gets the bound that means 64 registers
        cfg = KernelConfig(threads, 8, 1, "smem", "two_pass", 1, 0, 0, 64)
        assert H200.regs_per_sm // (space.capped_blocks(cfg) * threads) == 64


def test_max_regs_label_and_round_trip():
    assert CAPPED_768.label() == "t128v8r4-registers-two_pass-c1-p0-m64"
    assert dataclasses.replace(CAPPED_768, max_regs=0).label().endswith("-p0")
    assert KernelConfig.from_dict(CAPPED_768.to_dict()) == CAPPED_768
    # Rows of a DB written before the field have no max_regs: uncapped.
    old = {k: v for k, v in CAPPED_768.to_dict().items() if k != "max_regs"}
    assert KernelConfig.from_dict(old).max_regs == 0


@pytest.mark.parametrize("config, problem, needle", [
    (dataclasses.replace(CAPPED_768, max_regs=48), BF16_768, "max_regs must be one of"),
    (KernelConfig(256, 8, 1, "bulk", "two_pass", 1, 0, 2, 64), BF16_4096, "sizes its own"),
    (KernelConfig(128, 4, 4, "registers", "two_pass", 1, 0, 0, 64), Problem(768, "float32"),
     "16-bit rows only"),
    (KernelConfig(256, 8, 1, "smem", "two_pass", 2, 0, 0, 64), BF16_4096, "cluster 1 only"),
    # 1024: 32 elements per thread in registers spilled under the cap (the shipped winner's)
    (CAPPED_768, Problem(1024, "bfloat16"), "spills under the cap"),
    # 1,024 threads already get 64 registers: the capped kernel would be the same kernel
    (KernelConfig(1024, 8, 4, "smem", "two_pass", 1, 0, 0, 64), BF16_4096, "changes nothing"),
])
def test_max_regs_rejected_where_it_spills_or_changes_nothing(config, problem, needle):
    assert_rejected(config, problem, needle)


def test_max_regs_is_searched_in_16_bit_only():
    for dtype in DTYPES:
        caps = {c.max_regs for c in enumerate_space(Problem(4096, dtype))}
        assert caps == ({0} if dtype == "float32" else {0, 64}), dtype


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_16_bit_seeds_are_capped_where_the_cap_applies(dtype):
    for hidden in (768, 2048, 8192):
        problem = Problem(hidden, dtype)
        seeds = space.seed_configs(problem)
        assert seeds[0] == default_config(problem)  # the sound default first
        capped = [s for s in seeds if s.max_regs]
        assert capped and all(check(s, problem) == [] for s in seeds)
        for s in seeds[1:]:  # a neighbour stays uncapped only where the cap cannot apply
            if s.cache != "bulk" and not s.max_regs:
                assert check(dataclasses.replace(s, max_regs=64), problem), s.label()
    assert not any(s.max_regs for s in space.seed_configs(Problem(768, "float32")))


def test_seeds_hold_a_one_warp_row_kernel_where_it_fits():
    # torch.compile's kernel at 768-1024 (one warp a row, the row in registers): x1.017 of the
    # t256v4r8 kernel at fp32 1024 (docs/tuning.md), and never sampled before it was seeded.
    for dtype, hidden in (("float32", 768), ("float32", 1024), ("bfloat16", 1024)):
        problem = Problem(hidden, dtype)
        warp_rows = [s for s in space.seed_configs(problem) if s.threads == 32]
        assert len(warp_rows) == 1, (dtype, hidden)
        cfg = warp_rows[0]
        assert (cfg.rows_per_block, cfg.cache, cfg.blocks_per_sm) == (1, "registers", 0)
        assert cfg.threads_per_row == 32 and check(cfg, problem) == []
    # rows too long for one warp's registers get no such seed
    assert not [s for s in space.seed_configs(Problem(4096, "float32")) if s.threads == 32]


def test_the_gpu_tests_named_configs_are_valid():
    """The GPU suite's hand-picked configs stay inside the space (checked here, without a GPU).

    A tightened rule can make a hand-picked config invalid, which only a GPU run would show:
    the Welford run cap once did so to two of them.
    """
    from test_gpu_kernels import REBASED_WELFORD

    for hidden, label, _ in REBASED_WELFORD:
        assert check(KernelConfig.from_label(label), Problem(hidden, "float32")) == [], label


def test_labels_parse_back():
    for problem in (BF16_768, Problem(65536, "float32")):
        for config in enumerate_space(problem)[::37]:
            assert KernelConfig.from_label(config.label()) == config
    for bad in ("t256v8r1-smem", "t256v8r1-smem-two_pass-c1-p0-x3", "smem"):
        with pytest.raises(ValueError, match="not a kernel label"):
            KernelConfig.from_label(bad)


def test_fp32_1024_thread_kernels_that_spill_at_64_registers_are_invalid():
    # rules_registers.spills_at_1024_fp32: fitted to nvcc 13.0 on 1,692 kernels, none spilled out
    # of sample (1,608 more at 18 other hidden sizes); the compile sweep would catch a regression.
    fp32 = {h: Problem(h, "float32") for h in (768, 12288, 16384, 24576)}
    spilling = [(12288, "t1024v4r2-none-welford-c1-p0"), (16384, "t1024v4r1-none-welford-c1-p0"),
                (768, "t1024v4r32-smem-two_pass-c1-p0")]
    clean = [(24576, "t1024v4r1-none-welford-c1-p0"), (12288, "t1024v4r4-none-welford-c1-p0"),
             (16384, "t1024v4r1-smem-two_pass-c1-p0"), (12288, "t512v4r2-none-welford-c1-p0")]
    for hidden, label in spilling:
        reasons = check(KernelConfig.from_label(label), fp32[hidden])
        assert any("spill at 64 registers" in r for r in reasons), (label, reasons)
    for hidden, label in clean:
        assert not check(KernelConfig.from_label(label), fp32[hidden]), label
    # 16-bit rows hold half the registers per element: the rule is fp32's only
    assert not check(KernelConfig.from_label("t1024v4r2-none-welford-c1-p0"),
                     Problem(12288, "bfloat16"))


def test_a_few_rows_add_clustered_latency_seeds():
    # A row split over 8 blocks of 128 threads won at 16384 rows 1 (x1.02-1.17) and rows 8 (fp16,
    # fp32) and lost at rows 64 (docs/tuning.md): seeded only while the blocks fit the SMs.
    for dtype in DTYPES:
        problem = Problem(16384, dtype)
        few = space.seed_configs(problem, rows=1)
        extra = [s for s in few if s not in space.seed_configs(problem)]
        assert [(s.cluster, s.threads, s.stages, s.cache) for s in extra] == [
            (8, 128, 1, "bulk"), (4, 128, 1, "bulk")], dtype
        # measured first (the bucket searches stop after 10 trials); at rows 1 the default, which
        # the search measures first, is the split itself
        assert few[0] == default_config(problem, rows=1) and few[:2] == extra
        assert sorted(few, key=str) == sorted(space.seed_configs(problem) + extra, key=str)
        assert all(check(s, problem) == [] for s in extra)
        assert [s.cluster for s in space.latency_seed_configs(problem, 16)] == [8, 4]
        assert [s.cluster for s in space.latency_seed_configs(problem, 32)] == [4]
        assert space.latency_seed_configs(problem, 64) == []
        many = space.seed_configs(problem, rows=4096)  # no split; the default for them first
        assert many[0] == default_config(problem, rows=4096) != default_config(problem)
        assert sorted(many, key=str) == sorted(space.seed_configs(problem), key=str)
    # rows too short for 8 slices of 128 threads' 16-byte vectors get no such seed
    assert space.latency_seed_configs(Problem(768, "bfloat16"), 1) == []
