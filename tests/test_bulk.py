"""Tests of the bulk-copy kernel family member (cache="bulk"): rules, occupancy, launch plan,
rendering, an nvcc spill check and the tuner's conditional parameters. CPU only; the compile
test skips itself without nvcc.
"""

from __future__ import annotations

import dataclasses

import optuna
import pytest
from fake_evaluator import FakeEvaluator, fake_median_us
from keep_x_cases import FWD_KEEP_CASES
from optuna.trial import FixedTrial, TrialState

from autonorm.codegen.kernel import DYNAMIC_MIN_TILES, LaunchPlan
from autonorm.dtypes import DTYPES
from autonorm.ops.layer_norm.codegen import render
from autonorm.ops.layer_norm.config import STAGES, KernelConfig
from autonorm.ops.layer_norm.family import FAMILY
from autonorm.ops.layer_norm.occupancy import BULK_MAX_WEIGHT_ITERS
from autonorm.ops.layer_norm.plan import (
    bulk_occupancy,
    fills_async,
    holds_fp32_tile,
    min_blocks_per_sm,
    smem_bytes,
)
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.rules import check
from autonorm.ops.layer_norm.rules_bulk import BULK_MAX_ITERS
from autonorm.ops.layer_norm.shape import bulk_scratch_bytes, derive_shape
from autonorm.ops.layer_norm.space import (
    MAX_BULK_SEEDS,
    bulk_seed_configs,
    enumerate_space,
    seed_configs,
)
from autonorm.runtime.limits import H200, DeviceLimits
from autonorm.runtime.offline import compile_offline, nvcc_path
from autonorm.tune.search import TuneSettings, tune
from autonorm.tune.storage import open_storage
from autonorm.tune.trials import has_all_params

BF16_4096 = Problem(4096, "bfloat16")
# A valid bulk configuration for bf16 4096: 256 threads, 16-byte vectors, 2 tiles in flight.
BASE = KernelConfig(256, 8, 1, "bulk", "two_pass", 1, 0, 2)


def bulk(**fields: object) -> KernelConfig:
    """BASE with some fields replaced."""
    return dataclasses.replace(BASE, **fields)


def assert_only_reason(
    cfg: KernelConfig, problem: Problem, needle: str, device: DeviceLimits = H200
) -> None:
    """``cfg`` is rejected for exactly one reason, and that reason names ``needle``."""
    reasons = check(cfg, problem, device)
    assert len(reasons) == 1 and needle in reasons[0], (cfg.label(), reasons)


# --------------------------------------------------------------------------- validity rules


def test_base_configs_are_valid():
    assert check(BASE, BF16_4096) == []
    assert check(bulk(rows_per_block=2), BF16_4096) == []  # 4 vectors per thread, 2 rows
    assert check(bulk(cluster=2), BF16_4096) == []
    assert check(bulk(threads=128, rows_per_block=4), Problem(256, "bfloat16")) == []
    assert check(bulk(vec=4), Problem(4096, "float32")) == []
    assert check(bulk(threads=1024, stages=1), Problem(65536, "bfloat16")) == []
    for stages in STAGES[1:]:
        assert check(bulk(stages=stages), BF16_4096) == []


@pytest.mark.parametrize(
    ("change", "problem", "needle"),
    [
        ({"stages": 0}, BF16_4096, "needs stages >= 1"),
        ({"stages": 5}, BF16_4096, "stages must be one of"),
        ({"vec": 4}, BF16_4096, "vec must be 16 bytes"),  # 8 bytes of bf16
        ({"vec": 2}, Problem(4096, "float32"), "vec must be 16 bytes"),
        ({"stats": "welford"}, BF16_4096, "two-pass statistics only"),
        ({"blocks_per_sm": 2}, BF16_4096, "blocks_per_sm is 0"),
        ({"threads": 64}, BF16_4096, "at least 128 threads"),  # 64 per row, 8 vectors each
        # 128 threads in rows of 16 (2 vectors each): sub-warp rows
        ({"threads": 128, "rows_per_block": 8}, Problem(256, "bfloat16"), "at least one warp"),
        # 4 rows of 64 threads: 8 vectors per thread, 4 allowed with several rows
        ({"rows_per_block": 4}, BF16_4096, "several rows per block"),
        # one row of 128 threads at hidden 16384: 16 vectors per thread, 8 allowed
        ({"threads": 128}, Problem(16384, "bfloat16"), "unrolls at most"),
        ({"cluster": 2, "rows_per_block": 2}, BF16_4096, "rows_per_block must be 1"),
        # two 128 KB tiles exceed the 227 KB opt-in shared memory
        ({"threads": 1024, "stages": 2}, Problem(65536, "bfloat16"), "shared memory"),
    ],
)
def test_each_bulk_rule_rejects_alone(change, problem, needle):
    assert_only_reason(bulk(**change), problem, needle)


def test_bulk_rule_limits_sit_where_documented():
    # rows of one warp per row at the limits: 8 vectors alone, 4 with several rows per block
    one_row = bulk(threads=256)
    assert derive_shape(one_row, Problem(16384, "bfloat16")).iters == BULK_MAX_ITERS
    assert check(one_row, Problem(16384, "bfloat16")) == []
    two_rows = bulk(threads=256, rows_per_block=2)
    assert derive_shape(two_rows, BF16_4096).iters == BULK_MAX_ITERS // 2
    assert check(two_rows, BF16_4096) == []
    assert check(two_rows, Problem(8192, "bfloat16"))  # 8 vectors with 2 rows


def test_bulk_needs_hopper():
    old = DeviceLimits(name="A100", cc=80)
    assert_only_reason(BASE, BF16_4096, "compute capability 9.0", old)
    assert not [c for c in enumerate_space(BF16_4096, old) if c.cache == "bulk"]
    assert bulk_seed_configs(BF16_4096, old) == []


def test_stages_only_for_bulk():
    for cache in ("registers", "smem", "none"):
        stats = "welford" if cache == "none" else "two_pass"
        other = KernelConfig(256, 8, 1, cache, stats, 1, 0, 0)
        assert check(other, BF16_4096) == []
        assert_only_reason(dataclasses.replace(other, stages=2), BF16_4096, "bulk-copy kernel only")
    for dtype in DTYPES:
        for cfg in enumerate_space(Problem(4096, dtype)):
            assert (cfg.stages > 0) == (cfg.cache == "bulk"), cfg.label()


def test_enumeration_holds_bulk_configs():
    configs = [c for c in enumerate_space(BF16_4096) if c.cache == "bulk"]
    assert configs
    assert {c.stats for c in configs} == {"two_pass"}
    assert {c.blocks_per_sm for c in configs} == {0}
    assert {c.vec * 2 for c in configs} == {16}
    assert {c.stages for c in configs} == set(STAGES[1:])
    assert all(c.threads >= 128 and c.threads_per_row >= 32 for c in configs)
    assert all(c.rows_per_block == 1 for c in configs if c.cluster > 1)
    assert {c.cluster for c in configs} >= {1, 2}


# --------------------------------------------------------------------------- config basics


def test_label_suffix():
    assert BASE.label() == "t256v8r1-bulk-two_pass-c1-p0-s2"
    assert bulk(cluster=2, stages=8).label().endswith("-c2-p0-s8")
    other = KernelConfig(256, 8, 1, "smem", "two_pass", 1, 0)
    assert other.label() == "t256v8r1-smem-two_pass-c1-p0"  # unchanged: no stage suffix
    assert len({bulk(stages=s).label() for s in STAGES[1:]}) == len(STAGES) - 1


def test_from_dict_round_trip():
    for cfg in (BASE, bulk(cluster=4, stages=6), KernelConfig(512, 4, 2, "smem", "welford")):
        assert KernelConfig.from_dict(cfg.to_dict()) == cfg
    # what a tuner trial stores for a bulk candidate: no stats, no blocks_per_sm
    params = {"threads": 256, "vec": 8, "rows_per_block": 1, "cache": "bulk", "cluster": 1,
              "stages": 2}
    assert KernelConfig.from_dict(params) == BASE
    # and for the others: no stages
    params = {"threads": 256, "vec": 8, "rows_per_block": 1, "cache": "registers",
              "cluster": 1, "stats": "two_pass", "blocks_per_sm": 4}
    assert KernelConfig.from_dict(params) == KernelConfig(256, 8, 1, "registers", "two_pass", 1, 4)
    # the bulk defaults fill only what is absent, and only for bulk
    explicit = {**BASE.to_dict(), "stats": "welford", "blocks_per_sm": 2}
    assert KernelConfig.from_dict(explicit) == bulk(stats="welford", blocks_per_sm=2)
    no_stats = {"threads": 256, "vec": 8, "cache": "smem"}
    assert KernelConfig.from_dict(no_stats).stats == KernelConfig().stats == "welford"


def test_smem_bytes_of_bulk():
    cases = [
        (BASE, BF16_4096, 1, 4096),
        (bulk(stages=3, rows_per_block=2), BF16_4096, 2, 4096),
        (bulk(stages=6, cluster=4), Problem(16384, "bfloat16"), 1, 4096),
        (bulk(vec=4, stages=4), Problem(1000, "float32"), 1, 1000),
    ]
    for cfg, problem, rows, segment in cases:
        expected = cfg.stages * rows * segment * problem.itemsize
        expected += bulk_scratch_bytes(cfg.stages, rows, cfg.cluster)
        assert smem_bytes(cfg, problem) == expected, cfg.label()
    # mbarriers, reduction scratch [2][32][2] floats, the cluster slots [2][rows][4] floats, the
    # claim ring (Q = max(2 x stages, 4) mbarriers and ints) and the stages' tiles (ints)
    ring = 6 * (8 + 4) + 3 * 4
    assert bulk_scratch_bytes(3, 2) == 3 * 8 + 2 * 32 * 2 * 4 + 2 * 2 * 4 * 4 + ring
    # a cluster: two exchange mbarriers, and a slot per block of the cluster [2][rows][C][4]
    assert bulk_scratch_bytes(3, 2, 4) == 3 * 8 + 2 * 8 + 2 * 32 * 2 * 4 + 2 * 2 * 4 * 4 * 4 + ring
    # one stage still gets a ring of four (its claim may be pushed before the last is taken)
    assert bulk_scratch_bytes(1, 1) == 8 + 2 * 32 * 2 * 4 + 2 * 4 * 4 + 4 * (8 + 4) + 4


# --------------------------------------------------------------------------- occupancy


def test_bulk_occupancy_returns_at_least_one_block():
    for dtype in DTYPES:
        for hidden in (768, 4096, 65536):
            for affine in ((True, True), (False, False)):
                problem = Problem(hidden, dtype, *affine)
                for cfg in enumerate_space(problem):
                    if cfg.cache != "bulk":
                        continue
                    blocks, wreg = bulk_occupancy(cfg, problem)
                    assert blocks >= 1
                    assert blocks * cfg.threads <= H200.max_threads_per_sm or blocks == 1
                    by_smem = H200.smem_per_sm // (smem_bytes(cfg, problem) + 1024)
                    assert blocks <= max(1, by_smem)
                    assert min_blocks_per_sm(cfg, problem) == blocks
                    assert not wreg or any(affine)  # nothing to hold without weight or bias
                    assert not wreg or derive_shape(cfg, problem).iters <= BULK_MAX_WEIGHT_ITERS


def test_weights_in_registers_for_large_clustered_rows():
    problem = Problem(65536, "bfloat16")
    cfg = KernelConfig(512, 8, 1, "bulk", "two_pass", 2, 0, 2)
    assert check(cfg, problem) == []
    assert bulk_occupancy(cfg, problem) == (1, True)  # 128 KB of stages: one block anyway


def test_weights_in_registers_decided_at_the_blocks_reached():
    # 32 KB segments x 2 stages at 256 threads: shared memory would allow 3 blocks, the kernel's
    # own registers 2; at 2 blocks weight and bias fit in registers too, so they are held there
    # (deciding at 3 left them in L1: x0.984 on the H200; docs/registers.md).
    problem = Problem(32768, "bfloat16")
    cfg = KernelConfig(256, 8, 1, "bulk", "two_pass", 2, 0, 2)
    assert check(cfg, problem) == []
    assert H200.smem_per_sm // (smem_bytes(cfg, problem) + 1024) == 3
    assert bulk_occupancy(cfg, problem) == (2, True)
    assert "Vec wr[ITERS]" in render(cfg, problem).source


def test_no_weights_in_registers_where_occupancy_would_drop():
    # 16 KB tiles x 3 stages at 256 threads: shared memory allows 4 blocks per SM; weight and
    # bias in registers would need more registers than 4 blocks of 256 threads have.
    problem = Problem(8192, "bfloat16")
    cfg = KernelConfig(256, 8, 1, "bulk", "two_pass", 1, 0, 3)
    assert derive_shape(cfg, problem).smem_cache_bytes == 16384
    assert check(cfg, problem) == []
    by_smem = H200.smem_per_sm // (smem_bytes(cfg, problem) + 1024)
    assert by_smem == 4
    assert bulk_occupancy(cfg, problem) == (by_smem, False)
    # Without bias the weights alone fit at that occupancy.
    weight_only = Problem(8192, "bfloat16", has_bias=False)
    assert bulk_occupancy(cfg, weight_only) == (by_smem, True)


# --------------------------------------------------------------------------- launch plan


def resident_plan(cluster: int, rows_per_block: int, blocks_per_sm: int) -> LaunchPlan:
    return LaunchPlan(256, 50000, cluster, rows_per_block, blocks_per_sm, resident=True)


def test_resident_grid_examples():
    plan = resident_plan(4, 1, 2)
    assert plan.grid(4096, 132) == 132 * 2  # 66 clusters of 4: as many as fit
    assert plan.grid(4096, 132, resident_clusters=30) == 120  # what the occupancy API says
    assert plan.grid(10, 132) == 40  # 10 tiles: no more clusters than tiles
    assert plan.grid(10, 132, resident_clusters=30) == 40
    assert plan.grid(0, 132) == 4  # always one cluster
    assert plan.grid(4096, 1) == 4  # 1 SM x 2 blocks < a cluster of 4: still one cluster
    tiles = resident_plan(1, 4, 3)
    assert tiles.grid(10, 132) == 3  # 3 tiles of 4 rows
    assert tiles.grid(100000, 132) == 132 * 3
    assert tiles.grid(100000, 132, resident_clusters=400) == 400


def test_resident_grid_properties():
    for cluster in (1, 2, 4, 8):
        for rpb in (1, 2, 16):
            for bps in (1, 2, 7):
                plan = resident_plan(cluster, rpb, bps)
                for rows in (1, 5, 131, 4096, 1 << 20):
                    tiles = -(-rows // rpb)
                    for sm in (1, 132):
                        for resident in (None, 1, 17, 100000):
                            g = plan.grid(rows, sm, resident_clusters=resident)
                            assert g % cluster == 0 and g >= cluster
                            assert g // cluster <= tiles  # never more tiles than exist
                            cap = resident or max(1, sm * bps // cluster)
                            assert g // cluster == min(tiles, cap)


def test_the_counter_only_from_enough_tiles_a_cluster():
    n = DYNAMIC_MIN_TILES
    plan = resident_plan(4, 1, 2)  # 66 clusters of 4 on 132 SMs
    grid = plan.grid(1 << 20, 132)
    assert plan.uses_counter(n * 66, grid)
    assert not plan.uses_counter(n * 66 - 1, grid)
    assert plan.uses_counter(n * 30, 120)  # 30 clusters resident: the grid's clusters count
    assert not plan.uses_counter(n * 66 - 1, 264)
    rows4 = resident_plan(1, 4, 1)  # tiles of 4 rows
    assert rows4.uses_counter(4 * n * 132 - 3, 132)  # a ragged last tile counts as a tile
    assert not rows4.uses_counter(4 * n * 132 - 4, 132)
    assert not plan.uses_counter(1, plan.grid(1, 132))  # one tile: static
    fwd = LaunchPlan(256, 0, 1, 1, 0)  # not the bulk kernel: never a counter
    assert not fwd.uses_counter(1 << 20, 132)


def test_rendered_bulk_plan():
    problem = Problem(65536, "bfloat16")
    cfg = KernelConfig(512, 8, 1, "bulk", "two_pass", 2, 0, 2)
    k = render(cfg, problem)
    assert k.launch.resident and k.launch.blocks_per_sm == 1 and k.launch.cluster == 2
    assert k.launch.smem_bytes == smem_bytes(cfg, problem)
    assert k.launch.grid(4096, 132) == 132  # 66 resident clusters of 2
    assert k.launch.grid(4096, 132, resident_clusters=60) == 120
    assert k.launch.grid(3, 132) == 6


# --------------------------------------------------------------------------- seeds


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [768, 1000, 4096, 16384, 65536])
def test_bulk_seed_configs(dtype, hidden):
    problem = Problem(hidden, dtype)
    seeds = bulk_seed_configs(problem)
    assert len(seeds) <= MAX_BULK_SEEDS
    assert len(set(seeds)) == len(seeds)
    for cfg in seeds:
        assert cfg.cache == "bulk" and check(cfg, problem) == [], cfg.label()
    all_seeds = seed_configs(problem)
    assert set(seeds) <= set(all_seeds)
    assert len(set(all_seeds)) == len(all_seeds)
    assert all(check(c, problem) == [] for c in all_seeds)


def test_bulk_seeds_exist_where_sweeps_found_winners():
    for problem in (Problem(65536, "bfloat16"), Problem(32768, "float32"),
                    Problem(65536, "float32"), BF16_4096):
        seeds = bulk_seed_configs(problem)
        assert seeds, problem
        assert {c.stages for c in seeds} <= {2, 3}
    assert any(c.cluster == 2 for c in bulk_seed_configs(Problem(65536, "bfloat16")))
    assert any(c.cluster == 4 for c in bulk_seed_configs(Problem(65536, "float32")))
    # Rows of 16-32 KB: the row-a-tile winners settled head to head (docs/bulk-kernel.md).
    for problem, label in ((Problem(4096, "float32"), "t128v4r1-bulk-two_pass-c1-p0-s4-k"),
                           (Problem(8192, "float32"), "t256v4r1-bulk-two_pass-c1-p0-s3-k"),
                           (Problem(8192, "bfloat16"), "t128v8r1-bulk-two_pass-c1-p0-s4-k"),
                           (Problem(16384, "float16"), "t256v8r1-bulk-two_pass-c1-p0-s3-k")):
        assert label in [c.label() for c in bulk_seed_configs(problem)], problem
    # Two 256-thread blocks an SM with a finer cluster (the winners at bf16 65536 and fp32
    # 32768) are seeded.
    for problem, cluster in ((Problem(65536, "bfloat16"), 4), (Problem(32768, "float32"), 4),
                             (Problem(32768, "bfloat16"), 2)):
        seeds = bulk_seed_configs(problem)
        assert any(c.threads == 256 and c.cluster == cluster for c in seeds), problem
        assert all(bulk_occupancy(c, problem)[0] == 2 for c in seeds if c.threads == 256)


# --------------------------------------------------------------------------- rendering

RENDER_CASES = [
    (BASE, BF16_4096),
    (bulk(cluster=2, stages=6), Problem(4096, "bfloat16", False, False)),
    (bulk(rows_per_block=2, stages=3), Problem(4096, "float16", True, False)),
    (bulk(vec=4, stages=2), Problem(1000, "float32", False, True)),
    (KernelConfig(512, 8, 1, "bulk", "two_pass", 2, 0, 2), Problem(65536, "bfloat16")),
    (KernelConfig(512, 4, 1, "bulk", "two_pass", 4, 0, 3), Problem(65536, "float32")),
    (KernelConfig(128, 8, 1, "bulk", "two_pass", 8, 0, 4), Problem(16384, "bfloat16")),
    # a 16-element tile held as fp32
    (KernelConfig(1024, 8, 2, "bulk", "two_pass", 1, 0, 2), Problem(8192, "bfloat16")),
]


@pytest.mark.parametrize(("cfg", "problem"), RENDER_CASES, ids=lambda x: str(x))
def test_render_bulk(cfg, problem):
    a, b = render(cfg, problem), render(cfg, problem)
    assert a == b and a.source.encode() == b.source.encode()  # deterministic
    src = a.source
    assert "cp.async.bulk" in src and "mbarrier" in src
    assert "bar.sync" not in src  # no named barriers: __syncthreads only
    assert cfg.label() in src
    assert ("__cluster_dims__" in src) == (cfg.cluster > 1)
    assert ("const Vec wv" in src) == problem.has_weight
    assert ("const Vec bv" in src) == problem.has_bias
    blocks, wreg = bulk_occupancy(cfg, problem)
    assert f"__launch_bounds__({cfg.threads}, {blocks})" in src
    ftile = holds_fp32_tile(cfg, problem)
    assert ("float fx[ITERS][V];" in src) == ftile
    assert ("Vec wr[ITERS];" in src) == (wreg and not ftile and problem.has_weight)
    assert ("Vec br[ITERS];" in src) == (wreg and not ftile and problem.has_bias)
    assert src.count("if (t2 < tiles) {") == 1  # one refill per tile, either way
    # the tile schedule: a counter in the kernel's last parameter, claimed ahead, counted out and
    # zeroed at a cluster's first claim past the end, not at exit (no fence there)
    assert "unsigned int* __restrict__ work)" in src
    assert src.count("atomicAdd(work, 1u)") == 1  # in claim_tile only
    assert src.count("claim_tile(work, tiles, failed)") == 2  # the first claim, one per tile
    assert "atomicExch(work, 0u)" in src and "atomicExch(work + 1, 0u)" in src
    assert "__threadfence()" not in src
    assert ("push_to(&sched[" in src) == (cfg.cluster > 1)
    # One block barrier fewer a tile: a tile held in registers is refilled after the first row
    # sum's barrier, a tile read from shared memory until the last pass (two stages or more) in
    # the next iteration after it; rows of one warp have no barrier in their sums and keep one.
    rows_of_warps = derive_shape(cfg, problem).threads_per_row > 32
    deferred = not ftile and cfg.stages >= 2 and rows_of_warps and cfg.cluster == 1
    assert ("row_sum's barrier: every thread holds its part of the tile" in src) == (
        ftile and rows_of_warps)
    assert ("prev_tile" in src) == deferred
    assert ("__syncthreads();  // every thread is done with stage s" in src) == (
        not ftile and not deferred)
    # fp32 reduces its pass-2 sums (M2 and the mean's correction) through one barrier
    assert ("row_sum2(s2, s3, red, buf, warp, group);" in src) == (problem.itemsize == 4)
    assert f"constexpr int S = {cfg.stages};" in src
    assert a.launch.blocks_per_sm == blocks and a.launch.resident
    assert "{{" not in src and "{%" not in src and src.count("{") == src.count("}")


def test_fp32_tile_only_for_short_16bit_tiles():
    # H200: 16-element tiles at t1024 x1.02-1.05; 32-element tiles at 64 registers spilled
    # 48-56 bytes, and with registers of their own ran x0.91-1.01 (docs/bulk-kernel.md); fp32
    # tiles need no conversion.
    bf16 = Problem(16384, "bfloat16")
    t1024 = KernelConfig(1024, 8, 1, "bulk", "two_pass", 1, 0, 2)  # 2 vectors per thread
    assert holds_fp32_tile(t1024, bf16)
    assert holds_fp32_tile(t1024, Problem(16384, "float16"))
    assert not holds_fp32_tile(dataclasses.replace(t1024, threads=512), bf16)  # 32 elements
    assert not holds_fp32_tile(dataclasses.replace(t1024, vec=4), Problem(16384, "float32"))
    assert not holds_fp32_tile(KernelConfig(1024, 8, 1, "registers"), bf16)
    src = render(t1024, bf16).source
    assert src.split("float fx[ITERS][V];")[1].count("elem(xv, q)") == 1  # converted once
    # the stage is refilled once per tile, right after the tile left it
    assert src.count("fetch_tile(stages + (size_t)(s) * R * SEG, x, t2 * R") == 1
    assert "every thread holds its part of the tile: refill stage s" in src


def test_render_differs_by_stages():
    sources = {render(bulk(stages=s), BF16_4096).source for s in STAGES[1:]}
    assert len(sources) == len(STAGES) - 1


# --------------------------------------------------------------------------- nvcc


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc not found on PATH")
def test_bulk_kernels_compile_without_spills():
    kernels = [render(cfg, problem, H200) for cfg, problem in RENDER_CASES]
    assert {k.problem.dtype for k in kernels} == set(DTYPES)
    assert {k.config.cluster for k in kernels} == {1, 2, 4, 8}
    reports = compile_offline(kernels, "sm_90")
    spilled = []
    for k in kernels:
        report = reports[k.name]
        assert 0 < report.registers <= 255
        # __launch_bounds__(threads, blocks_per_sm) held: that many blocks fit the registers
        assert report.registers * k.config.threads * k.launch.blocks_per_sm <= H200.regs_per_sm
        if report.spills:
            spilled.append(f"{k.problem} {k.config.label()}: {report.registers} regs, "
                           f"{report.stack_frame} B frame, {report.spill_stores} B stores")
    assert not spilled, "\n".join(spilled)


# --------------------------------------------------------------------------- tuner

BULK_PARAMS = {"threads": 512, "vec": 8, "rows_per_block": 1, "cache": "bulk", "cluster": 2,
               "stages": 2, "keep_x": True}


def test_suggest_config_asks_stages_only_for_bulk():
    trial = FixedTrial(BULK_PARAMS)  # no stats, no blocks_per_sm: they are not asked
    cfg = FAMILY.suggest(trial)
    assert cfg == KernelConfig(512, 8, 1, "bulk", "two_pass", 2, 0, 2, keep_x=True)
    assert trial.params == BULK_PARAMS
    assert KernelConfig.from_dict(trial.params) == cfg
    other = {"threads": 256, "vec": 8, "rows_per_block": 1, "cache": "smem", "cluster": 1,
             "keep_x": True, "stats": "two_pass", "blocks_per_sm": 2, "max_regs": 64}
    trial = FixedTrial(other)  # no stages
    cfg = FAMILY.suggest(trial)
    assert cfg == KernelConfig(256, 8, 1, "smem", "two_pass", 1, 2, 0, 64, keep_x=True)
    assert trial.params == other and KernelConfig.from_dict(trial.params) == cfg
    # A bulk trial never reads stats, blocks_per_sm or max_regs, even when they are given.
    trial = FixedTrial({**BULK_PARAMS, "stats": "welford", "blocks_per_sm": 4, "max_regs": 64})
    cfg = FAMILY.suggest(trial)
    assert cfg.stats == "two_pass" and cfg.max_regs == 0
    assert not {"stats", "blocks_per_sm", "max_regs"} & set(trial.params)


def test_a_study_reaches_bulk_configs(tmp_path):
    problem = Problem(65536, "bfloat16")
    bulk_seeds = bulk_seed_configs(problem)[:3]
    other = KernelConfig(1024, 8, 1, "smem", "two_pass", 1, 0)
    assert bulk_seeds and check(other, problem) == []
    favourite = bulk_seeds[1]

    def retime(cfg: KernelConfig) -> tuple[float, float]:
        return (5.0 if cfg == favourite else fake_median_us(cfg)), 0.005

    evaluator = FakeEvaluator(retime_fn=retime)
    path = tmp_path / "s.journal"
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        result = tune(
            problem, evaluator, limits=H200, storage=str(path), study_name="s",
            settings=TuneSettings(n_trials=5, batch=4, finals_top=4, finals_rounds=2),
            seeds=[*bulk_seeds, other], progress=False,
        )
    finally:
        optuna.logging.set_verbosity(level)
    assert evaluator.calls[:4] == [*bulk_seeds, other]
    assert result.best == favourite  # the finals rebuilt it from the trial's parameters
    study = optuna.load_study(study_name="s", storage=open_storage(str(path), "s"))
    bulk_trials = [t for t in study.trials if t.params.get("cache") == "bulk"]
    assert len(bulk_trials) >= len(bulk_seeds)
    for trial in bulk_trials:
        assert set(trial.params) == set(BULK_PARAMS)  # stats and blocks_per_sm not asked
        assert has_all_params(trial, FAMILY)
        cfg = KernelConfig.from_dict(trial.params)
        assert cfg.stats == "two_pass" and cfg.blocks_per_sm == 0 and cfg.stages >= 1
        if trial.state == TrialState.COMPLETE and trial.user_attrs.get("role") == "evaluate":
            assert trial.value == fake_median_us(cfg)
            assert cfg in evaluator.calls
    # A bulk trial whose process has not asked stages yet is not ready to compare against.
    first = bulk_trials[0]
    partial = optuna.trial.create_trial(
        state=TrialState.RUNNING,
        params={k: v for k, v in first.params.items() if k != "stages"},
        distributions={k: v for k, v in first.distributions.items() if k != "stages"},
    )
    assert not has_all_params(partial, FAMILY)


def test_keep_x_is_a_variant_with_its_own_label_and_render():
    problem = Problem(16384, "bfloat16")
    for cluster in (1, 4):
        plain = KernelConfig(256, 8, 1, "bulk", "two_pass", cluster, 0, 3)
        kept = dataclasses.replace(plain, keep_x=True)
        assert kept.label() == plain.label() + "-k"
        assert KernelConfig.from_label(kept.label()) == kept
        assert KernelConfig.from_dict(kept.to_dict()) == kept
        assert check(kept, problem) == []
        # the hint is in the kept render only, on every copy of x
        kept_src, plain_src = render(kept, problem).source, render(plain, problem).source
        assert "L2::evict_last" in kept_src and "cache_hint" not in plain_src
        assert kept_src.count(".L2::cache_hint [%0], [%1], %2, [%3], %4;") == 1
    # configs stored before keep_x existed read as the plain kernel
    old = {k: v for k, v in plain.to_dict().items() if k != "keep_x"}
    assert KernelConfig.from_dict(old) == plain
    assert {c.keep_x for c in enumerate_space(problem) if c.cache == "bulk"} == {False, True}
    assert {c.keep_x for c in enumerate_space(problem) if c.cache != "bulk"} == {False, True}
    assert all(c.keep_x for c in bulk_seed_configs(problem))


def test_keep_x_is_refused_to_clustered_fwd_kernels():
    # Clustered smem kernels with the hint raised an illegal instruction on the H200
    # (docs/l2-hints.md).
    problem = Problem(4096, "bfloat16")
    for cache in ("registers", "smem", "none"):
        plain = KernelConfig(64, 8, 1, cache, "two_pass" if cache != "none" else "welford", 2)
        assert check(plain, problem) == []
        kept = dataclasses.replace(plain, keep_x=True)
        assert any("cluster 1 only" in r for r in check(kept, problem))
    bulk = KernelConfig(256, 8, 1, "bulk", "two_pass", 2, 0, 2, keep_x=True)
    assert check(bulk, problem) == []


@pytest.mark.parametrize("label,hidden,dtype", [
    # Each of these faulted with the hint and verified without it (docs/l2-hints.md)
    ("t128v2r1-smem-two_pass-c1-p0-k", 4096, "float32"),    # 8-byte cp.async.ca, H200
    ("t128v1r1-smem-two_pass-c1-p0-k", 4096, "float32"),    # 4-byte
    ("t128v4r1-smem-two_pass-c1-p0-k", 4096, "float32"),    # 16-byte cp.async.cg
    ("t128v2r1-smem-two_pass-c1-p1-k", 4096, "float32"),    # a persistent grid
    ("t256v2r1-smem-two_pass-c1-p0-k", 16384, "float32"),
    ("t256v4r1-smem-welford-c1-p0-k", 16384, "bfloat16"),   # 16-bit, H100
    ("t256v4r1-smem-welford-c1-p4-k", 16384, "bfloat16"),
    # these verified, but share the hinted fill: refused until the cause is known
    ("t128v2r1-smem-welford-c1-p0-k", 4096, "float32"),
    ("t128v2r2-smem-two_pass-c1-p0-k", 4096, "float32"),
    ("t64v8r1-smem-two_pass-c1-p0-k", 4096, "bfloat16"),
    ("t128v4r1-smem-two_pass-c1-p0-k", 4096, "bfloat16"),
    ("t256v8r4-smem-two_pass-c1-p0-k-m64", 4096, "float16"),
])
def test_keep_x_is_refused_to_kernels_filled_by_cp_async(label, hidden, dtype):
    problem = Problem(hidden, dtype)
    kept = KernelConfig.from_label(label)
    assert kept.keep_x and fills_async(kept, problem)
    assert any("filled by cp.async" in r for r in check(kept, problem))
    assert check(dataclasses.replace(kept, keep_x=False), problem) == []


def test_keep_x_stays_where_the_hinted_loads_verified():
    # Kernels whose x goes through registers keep the hint (the fp32 768-2048 winners), and so
    # does the bulk kernel, whose hinted copies are cp.async.bulk
    for label, hidden, dtype in (("t128v4r1-registers-two_pass-c1-p0-k", 2048, "float32"),
                                 ("t512v2r1-smem-two_pass-c1-p0-k", 4096, "float32"),
                                 ("t256v8r1-smem-two_pass-c1-p0-k", 8192, "float16")):
        cfg, problem = KernelConfig.from_label(label), Problem(hidden, dtype)
        assert not fills_async(cfg, problem) and check(cfg, problem) == []
    assert check(KernelConfig.from_label("t128v4r1-bulk-two_pass-c1-p0-s4-k"),
                 Problem(4096, "float32")) == []


@pytest.mark.parametrize("config,hidden,dtype", FWD_KEEP_CASES)
def test_keep_x_hints_every_load_of_x_in_the_fwd_kernel(config, hidden, dtype):
    # Every global read of a row's vectors takes the policy; the plain render is untouched
    # (no hint, plain vector loads of x), so keep_x off renders the kernels measured before.
    problem = Problem(hidden, dtype)
    kept = dataclasses.replace(config, keep_x=True)
    assert check(config, problem) == [] and check(kept, problem) == []
    expected = (config.label().replace("-m", "-k-m") if config.max_regs
                else config.label() + "-k")
    assert kept.label() == expected
    kept_src, plain_src = render(kept, problem).source, render(config, problem).source
    assert "cache_hint" not in plain_src and "xpol" not in plain_src
    assert "load_vec(xr" in plain_src or "load_vec(nx" in plain_src
    assert "load_vec(xr" not in kept_src and "load_vec(nx" not in kept_src
    assert "createpolicy.fractional.L2::evict_last.b64" in kept_src
    assert "load_x(xr" in kept_src or "load_x(nx" in kept_src
    assert not fills_async(config, problem)
