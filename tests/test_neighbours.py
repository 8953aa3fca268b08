"""Lookup's neighbour step: a winner of another hidden size, carried over (CPU, real SQLite).

A problem with no winner of its own, in any bucket, borrows the configuration of the nearest
tuned shape (hidden size less than 2x away, timed at about 4x the rows or less) of the same
dtype and affine flags on the same device, user database first, if the family's rules accept
it for the new problem; else the default for its row count (docs/tuning.md).
"""

from __future__ import annotations

import math

import pytest

from autonorm import lookup
from autonorm.ops.base import problem_key
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.family import FAMILY, LayerNormFamily
from autonorm.ops.layer_norm.heuristic import default_config
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.rules import check
from autonorm.runtime.limits import H200
from autonorm.store.db import TuningDB, TuningKey

GPU = "gpu-test"
DEVICE = lookup.Device(GPU, H200)
METRICS = {"median_us": 10.0, "gbps": 3000.0, "share": 0.8}

ROW = KernelConfig(256, 8, 1, "smem", "two_pass", 1, 0)  # valid at bf16 4096, 5000 and 8192
ROW2 = KernelConfig(256, 8, 2, "smem", "two_pass", 1, 0)
BULK_8192 = KernelConfig(128, 8, 1, "bulk", "two_pass", 1, 0, 4, keep_x=True)  # 8 vectors
BULK_12288 = KernelConfig(256, 8, 1, "bulk", "two_pass", 1, 0, 4, keep_x=True)


@pytest.fixture
def user():
    with TuningDB() as db:
        yield db


@pytest.fixture
def shipped():
    with TuningDB(source="shipped") as db:
        yield db


def put(db: TuningDB, problem: Problem, config: KernelConfig, bucket: int,
        device: str = GPU, kernel: str | None = None, rows: int | None = None) -> None:
    """Store ``config`` as the winner of ``problem`` with the digest of its kernel there.

    ``rows``: the row count it was timed at, recorded in its metrics (else none is).
    """
    assert check(config, problem) == [], config.label()
    key = TuningKey.for_problem(device, problem, bucket)
    metrics = METRICS if rows is None else {**METRICS, "rows": rows}
    db.set_winner(key, config.to_dict(), metrics, kernel or lookup.kernel_of(config, problem, H200))


def test_the_winners_query_filters_by_dtype_across_problems(user):
    put(user, Problem(4096, "bfloat16"), ROW, 4096)
    put(user, Problem(8192, "bfloat16", has_bias=False), ROW, 64)
    put(user, Problem(4096, "float16"), ROW, 4096)
    put(user, Problem(4096, "bfloat16"), ROW, 4096, device="other-gpu")
    found = user.winners(GPU, "layer_norm", dtype="bfloat16")
    assert [(w.key.hidden, w.key.rows_bucket) for w in found] == [(4096, 4096), (8192, 64)]
    assert {w.key.device for w in found} == {GPU} and {w.key.dtype for w in found} == {"bfloat16"}
    assert len(user.winners(dtype="bfloat16")) == 3
    assert user.winners(GPU, "layer_norm", dtype="float32") == []


def test_the_family_measures_the_hidden_sizes_log_ratio():
    bf16 = Problem(4096, "bfloat16")
    assert FAMILY.neighbour_distance(bf16, Problem(5000)) == pytest.approx(math.log2(5000 / 4096))
    assert FAMILY.neighbour_distance(Problem(5000), bf16) == FAMILY.neighbour_distance(
        bf16, Problem(5000))
    assert FAMILY.neighbour_distance(bf16, Problem(8184)) is not None
    assert FAMILY.neighbour_distance(bf16, Problem(8192)) is None  # 2x: too far
    assert FAMILY.neighbour_distance(bf16, Problem(2048)) is None
    assert FAMILY.neighbour_distance(bf16, Problem(5000, "float16")) is None
    assert FAMILY.neighbour_distance(bf16, Problem(5000, has_weight=False)) is None
    assert FAMILY.neighbour_distance(bf16, Problem(5000, has_bias=False)) is None


def test_sizes_on_the_vector_grid_and_off_it_do_not_lend_to_each_other(user):
    # Off the 16-byte grid the same configuration runs the skewed paths: another kernel.
    bf16, fp32 = Problem(4096), Problem(4096, "float32")
    assert FAMILY.neighbour_distance(bf16, Problem(4100)) is None  # 4100 % 8: skewed in 16-bit
    assert FAMILY.neighbour_distance(Problem(4100), bf16) is None
    assert FAMILY.neighbour_distance(Problem(4100), Problem(4099)) == pytest.approx(
        math.log2(4100 / 4099))
    assert FAMILY.neighbour_distance(fp32, Problem(4100, "float32")) is not None  # 4100 % 4 == 0
    assert FAMILY.neighbour_distance(fp32, Problem(4099, "float32")) is None
    put(user, bf16, ROW, 4096)
    choice = lookup.choose(Problem(4100), 4096, DEVICE, [user])
    assert choice == lookup.Choice(default_config(Problem(4100), H200, 4096), "default")
    assert lookup.choose(Problem(4104), 4096, DEVICE, [user]).source == "user-neighbour"


def test_the_nearest_hidden_size_lends_its_winner(user):
    put(user, Problem(4096), ROW, 4096)
    put(user, Problem(8192), ROW2, 4096)
    choice = lookup.choose(Problem(5000), 4096, DEVICE, [user])  # 1.22x from 4096, 1.64x to 8192
    assert (choice.source, choice.config) == ("user-neighbour", ROW)
    assert choice.winner.key.problem == problem_key(Problem(4096))
    choice = lookup.choose(Problem(7000), 4096, DEVICE, [user])  # nearer 8192
    assert (choice.source, choice.config) == ("user-neighbour", ROW2)


def test_a_config_the_rules_refuse_for_the_new_size_is_passed_over(user):
    put(user, Problem(8192), BULK_8192, 8192)
    put(user, Problem(12288), BULK_12288, 8192)
    problem = Problem(9000)
    assert check(BULK_8192, problem)  # 9 vectors a thread: more than the bulk kernel's 8
    choice = lookup.choose(problem, 8192, DEVICE, [user])
    assert (choice.source, choice.config) == ("user-neighbour", BULK_12288)
    with TuningDB() as only_invalid:
        put(only_invalid, Problem(8192), BULK_8192, 8192)
        choice = lookup.choose(problem, 8192, DEVICE, [only_invalid])
        assert choice == lookup.Choice(default_config(problem, H200, 8192), "default")


def test_a_winner_stale_for_its_own_problem_is_passed_over(user):
    put(user, Problem(4096), ROW, 4096, kernel="0" * 64)  # timed on a kernel not rendered now
    put(user, Problem(8192), ROW2, 4096)
    choice = lookup.choose(Problem(5000), 4096, DEVICE, [user])
    assert (choice.source, choice.config) == ("user-neighbour", ROW2)


def test_the_user_database_lends_before_the_shipped_one(user, shipped):
    put(shipped, Problem(4096), ROW, 4096)  # nearer
    put(user, Problem(7000), ROW2, 4096)
    choice = lookup.choose(Problem(5000), 4096, DEVICE, [user, shipped])
    assert (choice.source, choice.config) == ("user-neighbour", ROW2)
    with TuningDB() as empty:
        choice = lookup.choose(Problem(5000), 4096, DEVICE, [empty, shipped])
        assert (choice.source, choice.config) == ("shipped-neighbour", ROW)


def test_a_problems_own_winners_come_before_a_neighbours(user, shipped):
    put(shipped, Problem(4096), ROW, 4096)
    put(user, Problem(5000), ROW2, 256)  # its own, in a bucket 16x away
    choice = lookup.choose(Problem(5000), 4096, DEVICE, [user, shipped])
    assert (choice.source, choice.config) == ("user-nearest", ROW2)


def test_a_neighbour_at_these_rows_comes_before_a_bucket_over_sixteen_times_away(user, shipped):
    put(shipped, Problem(4096), ROW, 4096)
    put(user, Problem(5000), ROW2, 128)  # its own, 32x away: another regime of rows
    choice = lookup.choose(Problem(5000), 4096, DEVICE, [user, shipped])
    assert (choice.source, choice.config) == ("shipped-neighbour", ROW)


def test_only_the_same_device_dtype_and_flags_lend(user):
    put(user, Problem(4096, "float16"), ROW, 4096)
    put(user, Problem(4096, has_bias=False), ROW, 4096)
    put(user, Problem(4096), ROW, 4096, device="other-gpu")
    choice = lookup.choose(Problem(5000), 4096, DEVICE, [user])
    assert choice.source == "default"
    assert lookup.choose(Problem(5000, "float16"), 4096, DEVICE, [user]).source == (
        "user-neighbour")


def test_the_hidden_sizes_bound(user):
    put(user, Problem(4096), ROW, 4096)
    assert lookup.choose(Problem(8192), 4096, DEVICE, [user]).source == "default"  # 2x
    assert lookup.choose(Problem(7784), 4096, DEVICE, [user]).source == "user-neighbour"  # 1.9x


def test_rows_buckets_at_most_two_octaves_away_lend(user):
    put(user, Problem(4096), ROW, 1024)
    put(user, Problem(4096), ROW2, 8192)
    problem = Problem(5000)
    assert lookup.choose(problem, 4096, DEVICE, [user]).config == ROW2  # 1 octave against 2
    assert lookup.choose(problem, 1024, DEVICE, [user]).config == ROW
    assert lookup.choose(problem, 256, DEVICE, [user]).config == ROW  # 2 octaves
    choice = lookup.choose(problem, 128, DEVICE, [user])  # 3 octaves: too far
    assert choice == lookup.Choice(default_config(problem, H200, 128), "default")
    # A tie goes to the larger bucket; without a row count the largest comes first.
    with TuningDB() as tie:
        put(tie, Problem(4096), ROW, 2048)
        put(tie, Problem(4096), ROW2, 8192)
        assert lookup.choose(problem, 4096, DEVICE, [tie]).config == ROW2
        assert lookup.choose(problem, None, DEVICE, [tie]).config == ROW2


def test_the_nearest_shape_adds_the_octaves_of_hidden_size_and_rows(user):
    # bf16 9488 at 7,073 rows: 8192's bulk winner at the same bucket gives a thread 10 vectors
    # (over the kernel's 8); 8192's row kernel of 4,096 rows is nearer in hidden size (0.21
    # octaves + 1) than 12288's bulk winner of the same bucket (0.37 + 0), which comes first.
    put(user, Problem(8192), BULK_8192, 8192)
    put(user, Problem(8192), ROW, 4096)
    put(user, Problem(12288), BULK_12288, 8192)
    choice = lookup.choose(Problem(9488), 7073, DEVICE, [user])
    assert (choice.source, choice.config) == ("user-neighbour", BULK_12288)
    # A hidden size nearly the same a bucket away (0.003 + 1) before one 1.8x away a bucket
    # away (0.85 + 1).
    with TuningDB() as db:
        put(db, Problem(5008), ROW, 2048)
        put(db, Problem(9000), ROW2, 8192)
        assert lookup.choose(Problem(5000), 4096, DEVICE, [db]).config == ROW


def test_the_row_counts_winners_were_timed_at_measure_the_distance(user):
    # 16,810 rows fall in bucket 32768, next to a winner timed at 16,384 (bucket 16384): 3992's
    # nearest shape is 4096's (0.04 + 0.5 octaves), not 2048's at 32,768 rows (0.96 + 0.5).
    put(user, Problem(4096), ROW, 16384, rows=16384)
    put(user, Problem(2048), ROW2, 32768, rows=32768)
    assert lookup.choose(Problem(3992), 16810, DEVICE, [user]).config == ROW
    # Timed at 2,000 rows: 2.5 octaves from the middle of bucket 512 (too far), 1.5 from 1024's.
    put(user, Problem(5008), ROW2, 2048, rows=2000)
    assert lookup.choose(Problem(5000), 512, DEVICE, [user]).source == "default"
    assert lookup.choose(Problem(5000), 1024, DEVICE, [user]).config == ROW2


def test_a_family_without_the_hook_lends_nothing(user, monkeypatch):
    put(user, Problem(4096), ROW, 4096)
    monkeypatch.delattr(LayerNormFamily, "neighbour_distance")
    assert lookup.choose(Problem(5000), 4096, DEVICE, [user]).source == "default"


def test_the_default_gets_the_row_count(user):
    problem = Problem(16384, "float32")
    few = lookup.choose(problem, 1, DEVICE, [user])
    many = lookup.choose(problem, 4096, DEVICE, [user])
    assert few == lookup.Choice(default_config(problem, H200, 1), "default")
    assert (few.config.cluster, many.config.cluster) == (8, 1)
