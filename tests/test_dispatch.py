"""CPU tests of autonorm.dispatch: choose_config lookup order, and layer_norm on NumPy.

Only the device query is faked (an H200); the user and shipped databases are real SQLite files.
"""

from __future__ import annotations

import numpy as np
import pytest

from autonorm import dispatch
from autonorm.errors import (
    DeviceMismatchError,
    InputError,
    ShapeError,
    UnsupportedDtypeError,
)
from autonorm.ops import layer_norm as codegen
from autonorm.ops.base import rows_bucket
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.rules import check
from autonorm.ops.layer_norm.space import default_config
import autonorm.runtime.device
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


def _key(bucket: int = ROWS) -> TuningKey:
    return TuningKey(
        device=H200.fingerprint,
        version=codegen.code_version(),
        dtype=PROBLEM.dtype,
        hidden=PROBLEM.hidden,
        has_weight=PROBLEM.has_weight,
        has_bias=PROBLEM.has_bias,
        rows_bucket=rows_bucket(bucket),
    )


def _put(path, config: KernelConfig, bucket: int = ROWS) -> None:
    with TuningDB(path) as store:
        store.set_winner(_key(bucket), config.to_dict(), METRICS)


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
    other = TuningKey(H200.fingerprint, codegen.code_version(), "float16", 2048, True, True, ROWS)
    with TuningDB(user) as store:
        store.set_winner(other, A.to_dict(), METRICS)
    assert dispatch.choose_config(PROBLEM, ROWS).source == "default"


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
    y = dispatch.layer_norm(x, w, b, eps=1e-5)
    assert isinstance(y, np.ndarray)
    assert y.shape == x.shape and y.dtype == x.dtype
    np.testing.assert_allclose(y.astype(np.float64), _reference(x, w, b, 1e-5), rtol=tol, atol=tol)


def test_layer_norm_rejects_int32():
    with pytest.raises(UnsupportedDtypeError):
        dispatch.layer_norm(np.ones((2, 8), np.int32))


def test_layer_norm_rejects_wrong_weight_size():
    x = np.ones((2, 8), np.float32)
    with pytest.raises(ShapeError):
        dispatch.layer_norm(x, np.ones(7, np.float32), np.ones(8, np.float32))


@pytest.mark.parametrize("eps", [0.0, -1e-5])
def test_layer_norm_rejects_non_positive_eps(eps):
    with pytest.raises(InputError):
        dispatch.layer_norm(np.ones((2, 8), np.float32), eps=eps)


def test_layer_norm_rejects_non_numpy_weight():
    class FakeTensor:  # has shape and dtype, but is no NumPy array
        shape = (8,)
        dtype = np.dtype(np.float32)

    x = np.ones((2, 8), np.float32)
    with pytest.raises(DeviceMismatchError):
        dispatch.layer_norm(x, FakeTensor())


def test_layer_norm_zero_rows():
    x = np.empty((0, 64), np.float32)
    w = np.ones(64, np.float32)
    y = dispatch.layer_norm(x, w, np.zeros(64, np.float32))
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
    # The shipped winners are keyed by the kernel templates' hash: a template change (even a
    # comment) without a re-tune would leave an H200 on defaults. This catches it on the CPU.
    import autonorm.runtime.device
    from autonorm import settings as config

    monkeypatch.setenv("AUTONORM_DB", str(tmp_path / "user.db"))
    monkeypatch.delenv("AUTONORM_SHIPPED_DB", raising=False)
    monkeypatch.delenv("AUTONORM_NO_SHIPPED_DB", raising=False)
    monkeypatch.setattr(autonorm.runtime.device, "query_device", lambda device_id=None: H200)
    assert config.shipped_db_path() is not None
    choice = dispatch.choose_config(Problem(hidden, dtype), rows)
    assert choice.source == "shipped", (choice, codegen.code_version())
