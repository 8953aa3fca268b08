"""The float64 gradients of LayerNorm and RMSNorm, and the torch layer's backward against them.

:func:`layer_norm_backward_reference` and :func:`rms_norm_backward_reference` are checked by
central finite differences of the float64 forward references and against torch's float64
autograd. Then the backward autonorm's torch ops register (PyTorch ops in float32, statistics
recomputed) is held to them on fp32 rows of mean 1000 and spread 0.1 (the offset rows of
docs/accuracy.md), through the op on CPU tensors. CPU only.
"""

from __future__ import annotations

import numpy as np
import pytest

from autonorm.ops.layer_norm.reference import layer_norm_backward_reference, layer_norm_reference
from autonorm.ops.rms_norm.reference import rms_norm_backward_reference, rms_norm_reference

EPS = 1e-5


def _finite_difference(f, a: np.ndarray, step: float = 1e-6) -> np.ndarray:  # noqa: ANN001
    """d f / d a by central differences (f returns a scalar), one element at a time."""
    grad = np.zeros_like(a)
    for i in np.ndindex(a.shape):
        keep = a[i]
        a[i] = keep + step
        up = f()
        a[i] = keep - step
        down = f()
        a[i] = keep
        grad[i] = (up - down) / (2 * step)
    return grad


def _inputs(shape: tuple[int, ...], seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    hidden = shape[-1]
    x = rng.standard_normal(shape) * 2 + 0.5
    dy = rng.standard_normal(shape)
    w = 1 + 0.3 * rng.standard_normal(hidden)
    b = 0.2 * rng.standard_normal(hidden)
    return x, dy, w, b


@pytest.mark.parametrize("shape", [(3, 7), (2, 2, 5)])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_gradients_are_the_finite_differences(shape, affine):
    x, dy, w, b = _inputs(shape, seed=1)
    weight, bias = (w, b) if affine else (None, None)

    def loss() -> float:
        return float((layer_norm_reference(x, weight, bias, EPS) * dy).sum())

    dx, dw, db = layer_norm_backward_reference(x, dy, weight, EPS)
    assert np.allclose(dx, _finite_difference(loss, x), rtol=1e-6, atol=1e-8)
    # LayerNorm does not move with a shift of its row: its x gradient sums to zero.
    assert np.abs(dx.sum(axis=-1)).max() < 1e-12
    if affine:
        assert np.allclose(dw, _finite_difference(loss, w), rtol=1e-6, atol=1e-8)
        assert np.allclose(db, _finite_difference(loss, b), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("form", ["weight", "offset", "none"])
def test_rms_norm_gradients_are_the_finite_differences(form):
    x, dy, w, _ = _inputs((3, 9), seed=2)
    weight = None if form == "none" else w - (1.0 if form == "offset" else 0.0)
    offset = form == "offset"

    def loss() -> float:
        return float((rms_norm_reference(x, weight, EPS, offset) * dy).sum())

    dx, dw = rms_norm_backward_reference(x, dy, weight, EPS, offset)
    assert np.allclose(dx, _finite_difference(loss, x), rtol=1e-6, atol=1e-8)
    if weight is None:
        assert dw is None
    else:
        assert np.allclose(dw, _finite_difference(loss, weight), rtol=1e-6, atol=1e-8)


def test_a_wrong_gradient_fails_the_finite_differences():
    # The check can fail: LayerNorm's x gradient without its mean term is not the derivative.
    x, dy, w, b = _inputs((3, 7), seed=3)
    dx, _, _ = layer_norm_backward_reference(x, dy, w, EPS)
    g = dy * w
    wrong = dx + (1.0 / np.sqrt(x.var(axis=-1, keepdims=True) + EPS)) * g.mean(-1, keepdims=True)

    def loss() -> float:
        return float((layer_norm_reference(x, w, b, EPS) * dy).sum())

    assert not np.allclose(wrong, _finite_difference(loss, x), rtol=1e-6, atol=1e-8)


def test_the_references_match_torchs_float64_autograd():
    torch = pytest.importorskip("torch")
    x, dy, w, b = _inputs((4, 33), seed=4)
    xt, wt, bt = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    torch.nn.functional.layer_norm(xt, (33,), wt, bt, EPS).backward(torch.tensor(dy))
    dx, dw, db = layer_norm_backward_reference(x, dy, w, EPS)
    for ours, theirs in ((dx, xt.grad), (dw, wt.grad), (db, bt.grad)):
        assert np.allclose(ours, theirs.numpy(), rtol=1e-12, atol=1e-12)
    xt, wt = (torch.tensor(a, requires_grad=True) for a in (x, w))
    torch.nn.functional.rms_norm(xt, (33,), wt, EPS).backward(torch.tensor(dy))
    dx, dw = rms_norm_backward_reference(x, dy, w, EPS)
    assert np.allclose(dx, xt.grad.numpy(), rtol=1e-12, atol=1e-12)
    assert np.allclose(dw, wt.grad.numpy(), rtol=1e-12, atol=1e-12)


def _offset_rows(rows: int, hidden: int, seed: int) -> tuple[np.ndarray, ...]:
    """fp32 rows of mean 1000 and spread 0.1, a gradient, and a weight and bias near 1 and 0."""
    rng = np.random.default_rng(seed)
    x = (1000 + 0.1 * rng.standard_normal((rows, hidden))).astype(np.float32)
    dy = rng.standard_normal((rows, hidden)).astype(np.float32)
    w = (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32)
    b = (0.1 * rng.standard_normal(hidden)).astype(np.float32)
    return x, dy, w, b


def _rel(a, ref: np.ndarray) -> float:  # noqa: ANN001
    a = np.asarray(a, dtype=np.float64)
    return float(np.linalg.norm(a - ref) / np.linalg.norm(ref))


@pytest.mark.parametrize("hidden", [1024, 4097])
def test_the_torch_layer_norm_backward_is_within_1e5_on_offset_rows(hidden):
    torch = pytest.importorskip("torch")
    import autonorm.torch as ant

    x, dy, w, b = _offset_rows(64, hidden, seed=hidden)
    xt, wt, bt = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    ant.layer_norm(xt, wt, bt, EPS).backward(torch.tensor(dy))
    wide = [a.astype(np.float64) for a in (x, dy, w)]
    dx, dw, db = layer_norm_backward_reference(*wide, EPS)
    errors = {"dx": _rel(xt.grad, dx), "dweight": _rel(wt.grad, dw), "dbias": _rel(bt.grad, db)}
    assert max(errors.values()) <= 1e-5, errors


@pytest.mark.parametrize("offset", [False, True])
def test_the_torch_rms_norm_backward_is_within_1e5_on_offset_rows(offset):
    torch = pytest.importorskip("torch")
    import autonorm.torch as ant

    x, dy, w, _ = _offset_rows(64, 2048, seed=7)
    xt, wt = (torch.tensor(a, requires_grad=True) for a in (x, w))
    ant.rms_norm(xt, wt, EPS, weight_offset=offset).backward(torch.tensor(dy))
    dx, dw = rms_norm_backward_reference(x.astype(np.float64), dy.astype(np.float64),
                                         w.astype(np.float64), EPS, offset)
    errors = {"dx": _rel(xt.grad, dx), "dweight": _rel(wt.grad, dw)}
    assert max(errors.values()) <= 1e-5, errors
