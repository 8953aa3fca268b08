"""CPU tests of autonorm.dispatch (the lookup order of choose_config) and of autonorm.api's
layer_norm on NumPy.

Only the device query is faked (an H200); the user and shipped databases are real SQLite files.
"""

from __future__ import annotations

import numpy as np
import pytest

from autonorm import api, dispatch, lookup
from autonorm.errors import (
    DeviceMismatchError,
    InputError,
    ShapeError,
    UnsupportedDtypeError,
)
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.rules import check
from autonorm.ops.layer_norm.space import default_config
from autonorm.runtime.device import DeviceInfo
from autonorm.store.db import TuningDB, TuningKey

H200 = DeviceInfo(
    name="NVIDIA H200",
    cc=90,
    sm_count=132,
    l2_bytes=62914560,
    smem_optin=232448,
    mem_bus_bits=6016,
    mem_clock_khz=3201000,
)

PROBLEM = Problem(4096, "float16", True, True)
ROWS = 8192  # bucket 8192
A = KernelConfig(256, 8, 2, "registers", "two_pass", 1, 0)
B = KernelConfig(256, 8, 2, "registers", "welford", 1, 0)
C = KernelConfig(256, 8, 2, "smem", "two_pass", 1, 0)
D = KernelConfig(256, 8, 2, "smem", "welford", 1, 0)
# 1024 threads for 512 vectors: over half the threads would idle, so check() rejects it.
INVALID = KernelConfig(1024, 8, 1, "registers", "two_pass", 1, 0)
METRICS = {"median_us": 10.0, "gbps": 3000.0, "share": 0.8}


@pytest.fixture
def dbs(tmp_path, monkeypatch):
    """Point autonorm at empty user and shipped DBs in tmp_path and fake an H200."""
    import autonorm.runtime.device

    user = tmp_path / "user.db"
    shipped = tmp_path / "shipped.db"
    monkeypatch.setenv("AUTONORM_DB", str(user))
    monkeypatch.setenv("AUTONORM_SHIPPED_DB", str(shipped))
    monkeypatch.delenv("AUTONORM_NO_SHIPPED_DB", raising=False)
    monkeypatch.setattr(autonorm.runtime.device, "query_device", lambda device_id=None: H200)
    TuningDB(shipped).close()  # an empty but valid shipped DB
    return user, shipped


def _key(bucket: int = ROWS, problem: Problem = PROBLEM) -> TuningKey:
    return TuningKey.for_problem(H200.fingerprint, problem, bucket)


def _kernel(config: KernelConfig, problem: Problem = PROBLEM) -> str:
    """The digest a tuner records for ``config`` (a placeholder for configs that cannot run)."""
    if check(config, problem, H200.limits()):
        return "0" * 64
    return lookup.kernel_of(config, problem, H200.limits())


def _put(path, config: KernelConfig, bucket: int = ROWS, kernel: str | None = None) -> None:
    with TuningDB(path) as store:
        store.set_winner(_key(bucket), config.to_dict(), METRICS, kernel or _kernel(config))


def test_configs_are_distinct_and_valid():
    limits = H200.limits()
    default = default_config(PROBLEM, limits)
    assert len({A, B, C, D, default}) == 5
    for cfg in (A, B, C, D):
        assert check(cfg, PROBLEM, limits) == []
    assert check(INVALID, PROBLEM, limits)


def test_default_when_nothing_tuned(dbs):
    choice = dispatch.choose_config(PROBLEM, ROWS)
    assert choice.source == "default"
    assert choice.config == default_config(PROBLEM, H200.limits())


def test_default_when_shipped_db_missing(dbs, monkeypatch, tmp_path):
    monkeypatch.setenv("AUTONORM_SHIPPED_DB", str(tmp_path / "absent.db"))
    assert dispatch.choose_config(PROBLEM, ROWS).source == "default"


def test_user_exact_beats_shipped_exact(dbs):
    user, shipped = dbs
    _put(user, A)
    _put(shipped, B)
    choice = dispatch.choose_config(PROBLEM, ROWS)
    assert (choice.source, choice.config) == ("user", A)


def test_shipped_exact_beats_user_nearest(dbs):
    user, shipped = dbs
    _put(user, A, bucket=ROWS * 2)
    _put(shipped, B)
    choice = dispatch.choose_config(PROBLEM, ROWS)
    assert (choice.source, choice.config) == ("shipped", B)


def test_user_nearest_beats_shipped_nearest(dbs):
    user, shipped = dbs
    _put(user, A, bucket=ROWS * 4)
    _put(shipped, B, bucket=ROWS * 2)  # nearer, but the user DB is asked first
    choice = dispatch.choose_config(PROBLEM, ROWS)
    assert (choice.source, choice.config) == ("user-nearest", A)


def test_user_nearest_picks_nearest_bucket(dbs):
    user, _ = dbs
    _put(user, A, bucket=ROWS * 8)
    _put(user, C, bucket=ROWS // 2)
    choice = dispatch.choose_config(PROBLEM, ROWS)
    assert (choice.source, choice.config) == ("user-nearest", C)


def test_shipped_nearest_when_user_has_nothing(dbs):
    _, shipped = dbs
    _put(shipped, D, bucket=ROWS // 4)
    choice = dispatch.choose_config(PROBLEM, ROWS)
    assert (choice.source, choice.config) == ("shipped-nearest", D)


@pytest.mark.parametrize("factor", [32, 1 / 32])
def test_a_bucket_over_sixteen_times_away_lends_nothing(dbs, factor):
    user, shipped = dbs
    _put(user, A, bucket=int(ROWS * factor))
    _put(shipped, B, bucket=int(ROWS * factor))
    rows = ROWS if factor > 1 else ROWS // 2 + 1  # the lowest row count of the bucket too
    choice = dispatch.choose_config(PROBLEM, rows)
    assert choice == dispatch.Choice(default_config(PROBLEM, H200.limits(), rows), "default")
    _put(shipped, D, bucket=int(ROWS * factor * (0.5 if factor > 1 else 2)))  # 16x away
    assert dispatch.choose_config(PROBLEM, rows) == dispatch.Choice(D, "shipped-nearest")
    assert lookup.NEAREST_MAX_OCTAVES == 4.0


@pytest.mark.parametrize("value", ["1", "yes"])
def test_no_keep_x_launches_the_winner_without_its_hint(dbs, monkeypatch, value):
    import dataclasses

    _, shipped = dbs
    kept = dataclasses.replace(C, keep_x=True)
    _put(shipped, kept)
    monkeypatch.delenv("AUTONORM_NO_KEEP_X", raising=False)
    assert dispatch.choose_config(PROBLEM, ROWS) == dispatch.Choice(kept, "shipped")
    monkeypatch.setenv("AUTONORM_NO_KEEP_X", "0")
    assert dispatch.choose_config(PROBLEM, ROWS).config == kept
    monkeypatch.setenv("AUTONORM_NO_KEEP_X", value)
    assert dispatch.choose_config(PROBLEM, ROWS) == dispatch.Choice(C, "shipped")


def test_other_problem_winner_is_not_used(dbs):
    user, _ = dbs
    other = Problem(2048, "float16", True, True)
    with TuningDB(user) as store:
        store.set_winner(_key(problem=other), A.to_dict(), METRICS, _kernel(A, other))
    assert dispatch.choose_config(PROBLEM, ROWS).source == "default"
    assert dispatch.choose_config(other, ROWS) == dispatch.Choice(A, "user")


def test_a_winner_whose_kernel_changed_is_skipped(dbs):
    user, shipped = dbs
    _put(user, A, kernel="f" * 64)  # timed on a kernel that A no longer renders
    _put(shipped, B)
    choice = dispatch.choose_config(PROBLEM, ROWS)
    assert (choice.source, choice.config) == ("shipped", B)
    _put(shipped, B, kernel=_kernel(C))  # the digest of another config's kernel
    _put(shipped, D, bucket=ROWS * 2)
    assert dispatch.choose_config(PROBLEM, ROWS) == dispatch.Choice(D, "shipped-nearest")


def test_a_stale_nearest_winner_gives_way_to_the_next_nearest(dbs):
    user, _ = dbs
    _put(user, A, bucket=ROWS * 2, kernel="f" * 64)
    _put(user, C, bucket=ROWS // 4)
    choice = dispatch.choose_config(PROBLEM, ROWS)
    assert (choice.source, choice.config) == ("user-nearest", C)
    assert choice.winner is not None and choice.winner.key == _key(ROWS // 4)


def test_the_choice_names_its_winner(dbs):
    _, shipped = dbs
    _put(shipped, B)
    choice = dispatch.choose_config(PROBLEM, ROWS)
    assert choice.winner.key == _key() and choice.winner.source == "shipped"
    assert choice.winner.kernel == _kernel(B)
    assert dispatch.choose_config(PROBLEM, ROWS * 16).winner.key == _key()  # nearest
    assert dispatch.choose_config(Problem(768), ROWS).winner is None  # default


def test_a_stored_config_the_family_cannot_read_is_skipped(dbs):
    user, shipped = dbs
    with TuningDB(user) as store:
        store.set_winner(_key(), {**A.to_dict(), "threads": "many"}, METRICS, "f" * 64)
    _put(shipped, B)
    assert dispatch.choose_config(PROBLEM, ROWS) == dispatch.Choice(B, "shipped")


def test_a_broken_user_db_does_not_stop_dispatch(dbs):
    user, shipped = dbs
    _put(shipped, B)
    user.mkdir()  # a directory where the user DB should be: it cannot be opened
    assert dispatch.choose_config(PROBLEM, ROWS) == dispatch.Choice(B, "shipped")


def test_invalid_user_winner_is_skipped(dbs):
    user, shipped = dbs
    _put(user, INVALID)
    _put(shipped, B)
    choice = dispatch.choose_config(PROBLEM, ROWS)
    assert (choice.source, choice.config) == ("shipped", B)


def test_invalid_user_nearest_is_skipped(dbs):
    user, shipped = dbs
    _put(user, INVALID, bucket=ROWS * 2)
    _put(shipped, C, bucket=ROWS * 4)
    choice = dispatch.choose_config(PROBLEM, ROWS)
    assert (choice.source, choice.config) == ("shipped-nearest", C)


def test_only_invalid_winners_give_default(dbs):
    user, shipped = dbs
    _put(user, INVALID)
    _put(shipped, INVALID, bucket=ROWS * 2)
    choice = dispatch.choose_config(PROBLEM, ROWS)
    assert choice.source == "default"
    assert choice.config == default_config(PROBLEM, H200.limits())


# -- layer_norm on NumPy --------------------------------------------------------------------


def _reference(x, w, b, eps):
    x64 = x.astype(np.float64)
    mean = x64.mean(-1, keepdims=True)
    var = ((x64 - mean) ** 2).mean(-1, keepdims=True)
    y = (x64 - mean) / np.sqrt(var + eps)
    if w is not None:
        y = y * w.astype(np.float64)
    if b is not None:
        y = y + b.astype(np.float64)
    return y


@pytest.mark.parametrize(("dtype", "tol"), [(np.float32, 1e-5), (np.float16, 2e-3)])
@pytest.mark.parametrize("affine", [(True, True), (True, False), (False, False)])
def test_layer_norm_numpy_matches_reference(dtype, tol, affine):
    rng = np.random.default_rng(0)
    hidden = 768
    x = (rng.standard_normal((3, 5, hidden)) * 2 + 1).astype(dtype)
    w = rng.standard_normal(hidden).astype(dtype) if affine[0] else None
    b = rng.standard_normal(hidden).astype(dtype) if affine[1] else None
    y = api.layer_norm(x, w, b, eps=1e-5)
    assert isinstance(y, np.ndarray)
    assert y.shape == x.shape and y.dtype == x.dtype
    np.testing.assert_allclose(y.astype(np.float64), _reference(x, w, b, 1e-5), rtol=tol, atol=tol)


def test_layer_norm_rejects_int32():
    with pytest.raises(UnsupportedDtypeError):
        api.layer_norm(np.ones((2, 8), np.int32))


def test_layer_norm_rejects_wrong_weight_size():
    x = np.ones((2, 8), np.float32)
    with pytest.raises(ShapeError):
        api.layer_norm(x, np.ones(7, np.float32), np.ones(8, np.float32))


@pytest.mark.parametrize("eps", [0.0, -1e-5])
def test_layer_norm_rejects_non_positive_eps(eps):
    with pytest.raises(InputError):
        api.layer_norm(np.ones((2, 8), np.float32), eps=eps)


def test_layer_norm_rejects_non_numpy_weight():
    class FakeTensor:  # has shape and dtype, but is no NumPy array
        shape = (8,)
        dtype = np.dtype(np.float32)

    x = np.ones((2, 8), np.float32)
    with pytest.raises(DeviceMismatchError):
        api.layer_norm(x, FakeTensor())


def test_layer_norm_zero_rows():
    x = np.empty((0, 64), np.float32)
    w = np.ones(64, np.float32)
    y = api.layer_norm(x, w, np.zeros(64, np.float32))
    assert isinstance(y, np.ndarray)
    assert y.shape == (0, 64) and y.dtype == np.float32


SHIPPED_GRID = [(dtype, hidden, (1 << 26) // hidden)
                for dtype in ("bfloat16", "float16", "float32")
                for hidden in (768, 1024, 2048, 4096, 8192, 12288, 16384, 32768, 65536)]
SHIPPED_BUCKETS = [(dtype, 16384, rows) for dtype in ("bfloat16", "float16", "float32")
                   for rows in (1, 8, 64, 512)] + [
                   (dtype, hidden, 4096) for dtype in ("bfloat16", "float16", "float32")
                   for hidden in (4096, 8192)]


@pytest.mark.parametrize(("dtype", "hidden", "rows"), SHIPPED_GRID + SHIPPED_BUCKETS)
def test_the_repos_shipped_db_serves_the_benchmark_grid_on_an_h200(
        dtype, hidden, rows, tmp_path, monkeypatch):
    # A shipped winner is used while its configuration renders the kernel that was timed: a
    # change to a kernel's code without a re-tune would leave an H200 on defaults. This catches
    # it on the CPU.
    import autonorm.runtime.device
    from autonorm import settings

    monkeypatch.setenv("AUTONORM_DB", str(tmp_path / "user.db"))
    monkeypatch.delenv("AUTONORM_SHIPPED_DB", raising=False)
    monkeypatch.delenv("AUTONORM_NO_SHIPPED_DB", raising=False)
    monkeypatch.delenv("AUTONORM_NO_KEEP_X", raising=False)
    monkeypatch.setattr(autonorm.runtime.device, "query_device", lambda device_id=None: H200)
    shipped_path = settings.shipped_db_path()
    assert shipped_path is not None
    problem = Problem(hidden, dtype)
    choice = dispatch.choose_config(problem, rows)
    assert choice.source == "shipped", choice
    # Exactly the stored configuration of that bucket.
    with TuningDB(shipped_path, read_only=True, immutable=True) as shipped:
        stored = shipped.get_winner(TuningKey.for_problem(H200.fingerprint, problem, rows))
    assert stored is not None
    assert choice.config == KernelConfig.from_dict(stored.config)
    assert choice.winner.key == stored.key
