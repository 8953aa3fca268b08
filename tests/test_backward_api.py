"""The public backward functions on NumPy arrays: float64 gradients, dh added, clear errors."""

from __future__ import annotations

import numpy as np
import pytest

import autonorm
from autonorm.errors import InputError
from autonorm.ops.norm_backward.problem import LayerNormBackward, RMSNormBackward


def _rows(seed: int, shape: tuple[int, ...] = (3, 5, 64)) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    x, dy, dh = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))
    w = (1 + 0.1 * rng.standard_normal(shape[-1])).astype(np.float32)
    return x, dy, dh, w


def _f64(*arrays: np.ndarray) -> list[np.ndarray]:
    return [a.reshape(-1, a.shape[-1]).astype(np.float64) for a in arrays]


def test_layer_norm_backward_returns_the_float64_gradients() -> None:
    x, dy, _, w = _rows(0)
    dx, dw, db = autonorm.layer_norm_backward(dy, x, w, w, eps=1e-5)
    ref = LayerNormBackward(64, "float32").gradients(*_f64(x, dy), w.astype(np.float64), 1e-5)
    assert dx.shape == x.shape and dx.dtype == np.float32
    assert np.array_equal(dx.reshape(-1, 64), ref["dx"].astype(np.float32))
    assert np.array_equal(dw, ref["dweight"].astype(np.float32))
    assert np.array_equal(db, _f64(dy)[0].sum(axis=0).astype(np.float32))


def test_without_weight_or_bias_their_gradients_are_none() -> None:
    x, dy, _, _ = _rows(1)
    _, dw, db = autonorm.layer_norm_backward(dy, x)
    assert dw is None and db is None
    _, dw = autonorm.rms_norm_backward(dy, x)
    assert dw is None


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_dh_is_added_to_dx_and_nothing_else(op: str) -> None:
    x, dy, dh, w = _rows(2)
    fn = getattr(autonorm, f"{op}_backward")
    plain = fn(dy, x, w)
    fused = fn(dy, x, w, dh=dh)
    np.testing.assert_allclose(fused[0], plain[0] + dh, rtol=1e-6, atol=1e-6)
    assert not np.allclose(fused[0], plain[0], atol=1e-3)
    for a, b in zip(fused[1:], plain[1:], strict=True):
        assert (a is None and b is None) or np.array_equal(a, b)


def test_rms_norm_backward_with_weight_offset_scales_by_one_plus_weight() -> None:
    x, dy, _, w = _rows(3)
    dx, dw = autonorm.rms_norm_backward(dy, x, w - 1, eps=1e-6, weight_offset=True)
    ref = RMSNormBackward(64, "float32").gradients(
        *_f64(x, dy), (w - 1).astype(np.float64) + 1, 1e-6)
    np.testing.assert_allclose(dx.reshape(-1, 64), ref["dx"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dw, ref["dweight"], rtol=1e-5)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [({"dh": np.zeros((3, 5, 32), np.float32)}, "dh must"), ({"dh": "grad"}, "dh must"),
     ({"eps": -1.0}, "eps")],
)
def test_bad_arguments_name_themselves(kwargs: dict, words: str) -> None:
    x, dy, _, w = _rows(4)
    with pytest.raises(InputError, match=words):
        autonorm.layer_norm_backward(dy, x, w, **kwargs)
