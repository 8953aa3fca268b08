"""GPU: bad and unusual CuPy inputs through :func:`autonorm.layer_norm`.

Wrong dtypes, shapes, eps and devices raise the documented errors before anything launches;
non-contiguous, misaligned, empty and one-element rows give the right answer; NaN and Inf spoil
their own row only. Results are checked against the float64 reference of
:mod:`autonorm.reference` (CuPy has no bfloat16, so float32 and float16 only).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import autonorm
from autonorm import dispatch
from autonorm.errors import (
    DeviceMismatchError,
    InputError,
    ShapeError,
    UnsupportedDtypeError,
)
from autonorm.numerics import measure_error
from autonorm.ops.layer_norm.reference import layer_norm_reference

# Dispatch from an empty user DB (and the shipped one), never the developer's own; cp is the
# conftest's CuPy on that DB.
pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_db")]

DTYPES = ["float32", "float16"]
EPS = 1e-5


def make(
    cp: Any,
    shape: tuple[int, ...],
    dtype: str,
    seed: int = 0,
    scale: float = 1.0,
    offset: float = 0.5,
) -> Any:
    """A CuPy array of ``offset + scale * normal`` values, rounded to ``dtype`` on the host."""
    rng = np.random.default_rng(seed)
    return cp.asarray((offset + scale * rng.standard_normal(shape)).astype(dtype))


def reference(x: Any, w: Any, b: Any, eps: float = EPS) -> np.ndarray:
    """Float64 LayerNorm of the (already rounded) inputs, on the host."""
    import cupy

    def f64(a: Any) -> np.ndarray | None:
        return None if a is None else cupy.asnumpy(a).astype(np.float64)

    return layer_norm_reference(f64(x), f64(w), f64(b), eps)


def assert_matches_reference(y: Any, x: Any, w: Any, b: Any, dtype: str) -> None:
    import cupy

    assert isinstance(y, cupy.ndarray)
    assert y.shape == x.shape and y.dtype == np.dtype(dtype)
    err = measure_error(cupy.asnumpy(y).astype(np.float64), reference(x, w, b))
    assert err.within(dtype), err


def affine(cp: Any, hidden: int, dtype: str) -> tuple[Any, Any]:
    """Weight near 1 and bias near 0, as trained LayerNorms have."""
    weight = make(cp, (hidden,), dtype, seed=1, scale=0.1, offset=1.0)
    bias = make(cp, (hidden,), dtype, seed=2, scale=0.5, offset=0.0)
    return weight, bias


# --------------------------------------------------------------------------- refused inputs


@pytest.mark.parametrize("dtype", ["int32", "float64", "int8", "complex64", "bool"])
def test_unsupported_dtype(cp, dtype):
    x = cp.zeros((4, 64), dtype=dtype)
    with pytest.raises(UnsupportedDtypeError, match="unsupported dtype"):
        autonorm.layer_norm(x)


def test_weight_dtype_differs_from_x(cp):
    x = make(cp, (4, 64), "float32")
    w, b = affine(cp, 64, "float16")
    with pytest.raises(UnsupportedDtypeError, match="differs"):
        autonorm.layer_norm(x, w)
    with pytest.raises(UnsupportedDtypeError, match="differs"):
        autonorm.layer_norm(x, None, b)


def test_zero_dimensional_input(cp):
    with pytest.raises(ShapeError, match="at least one dimension"):
        autonorm.layer_norm(cp.asarray(np.float32(1.5)))


def test_zero_hidden_size(cp):
    with pytest.raises(ShapeError, match="at least 1"):
        autonorm.layer_norm(cp.zeros((4, 0), dtype=cp.float32))


@pytest.mark.parametrize(
    "shape", [(63,), (65,), (1,), (64, 1), (1, 64), (2, 64)], ids=lambda s: "x".join(map(str, s))
)
@pytest.mark.parametrize("which", ["weight", "bias"])
def test_affine_of_the_wrong_shape(cp, which, shape):
    x = make(cp, (4, 64), "float32")
    bad = make(cp, shape, "float32")
    with pytest.raises(ShapeError, match=f"{which} must have shape \\(64,\\)"):
        autonorm.layer_norm(x, **{which: bad})


@pytest.mark.parametrize("eps", [0.0, -0.0, -1e-5, float("nan"), float("-inf")])
def test_eps_must_be_a_positive_number(cp, eps):
    x = make(cp, (4, 64), "float32")
    with pytest.raises(InputError, match=r"eps must be a (finite )?positive (real )?number"):
        autonorm.layer_norm(x, eps=eps)


# Found by this test: the CuPy path converted eps with float() before validating it.
@pytest.mark.parametrize("eps", ["1e-5", None])
def test_eps_that_is_not_a_number_is_an_input_error(cp, eps):
    x = make(cp, (4, 64), "float32")
    with pytest.raises(InputError, match=r"eps must be a (finite )?positive (real )?number"):
        autonorm.layer_norm(x, eps=eps)


def test_numpy_weight_with_gpu_x(cp):
    x = make(cp, (4, 64), "float32")
    w, b = affine(cp, 64, "float32")
    with pytest.raises(DeviceMismatchError, match="weight"):
        autonorm.layer_norm(x, cp.asnumpy(w), b)
    with pytest.raises(DeviceMismatchError, match="bias"):
        autonorm.layer_norm(x, w, cp.asnumpy(b))


def test_gpu_weight_with_numpy_x(cp):
    x = np.ones((4, 64), dtype=np.float32)
    w, _ = affine(cp, 64, "float32")
    with pytest.raises(DeviceMismatchError):
        autonorm.layer_norm(x, w)


def test_weight_on_another_gpu(cp):
    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    with cp.cuda.Device(0):
        x = make(cp, (4, 64), "float32")
        b = make(cp, (64,), "float32", 2)
    with cp.cuda.Device(1):
        w = make(cp, (64,), "float32", 1)
    with pytest.raises(DeviceMismatchError, match="weight is on GPU 1 but x is on GPU 0"):
        autonorm.layer_norm(x, w, b)


# --------------------------------------------------------------------------- unusual inputs


@pytest.mark.parametrize("dtype", DTYPES)
def test_transposed_and_strided_views(cp, dtype):
    w, b = affine(cp, 512, dtype)
    transposed = make(cp, (512, 48), dtype).T  # (48, 512), column-major
    strided = make(cp, (48, 1024), dtype, seed=3)[:, ::2]  # every other element
    rows_skipped = make(cp, (3, 40, 512), dtype, seed=4)[:, ::3]  # rows with gaps, 3-D
    for x in (transposed, strided, rows_skipped):
        assert not x.flags.c_contiguous
        before = x.copy()
        y = autonorm.layer_norm(x, w, b)
        assert y.flags.c_contiguous
        assert_matches_reference(y, x, w, b, dtype)
        assert bool((x == before).all())  # the input is not written
    # Non-contiguous weight and bias are accepted too.
    w2, b2 = make(cp, (1024,), dtype, 5)[::2], make(cp, (1024,), dtype, 6)[::2]
    x = make(cp, (48, 512), dtype, seed=7)
    assert_matches_reference(autonorm.layer_norm(x, w2, b2), x, w2, b2, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_misaligned_views(cp, dtype):
    rows, hidden = 33, 768
    buf = make(cp, (rows * hidden + 1,), dtype)
    x = buf[1:].reshape(rows, hidden)
    assert x.flags.c_contiguous and x.data.ptr % 16
    wbuf, bbuf = make(cp, (hidden + 1,), dtype, 1), make(cp, (hidden + 3,), dtype, 2)
    w, b = wbuf[1:], bbuf[3:]
    assert w.data.ptr % 16 and b.data.ptr % 16
    assert_matches_reference(autonorm.layer_norm(x, w, b), x, w, b, dtype)
    assert_matches_reference(autonorm.layer_norm(x), x, None, None, dtype)


@pytest.mark.parametrize("shape", [(0, 64), (3, 0, 64), (0, 1)])
def test_no_rows_gives_an_empty_result_without_a_launch(cp, monkeypatch, shape):
    def no_kernel(*args: object, **kwargs: object) -> None:
        raise AssertionError("a kernel was looked up for an empty input")

    monkeypatch.setattr(dispatch, "get_kernel", no_kernel)
    x = cp.empty(shape, dtype=cp.float16)
    w, b = affine(cp, shape[-1], "float16")
    y = autonorm.layer_norm(x, w, b)
    assert isinstance(y, cp.ndarray) and y.shape == shape and y.dtype == cp.float16


@pytest.mark.parametrize("dtype", DTYPES)
def test_hidden_one_gives_the_bias_exactly(cp, dtype):
    # One element per row: x - mean is exactly 0 and the variance 0, so y = 0 * w + b = b.
    x = make(cp, (37, 1), dtype, scale=100.0)
    w, b = make(cp, (1,), dtype, 1), make(cp, (1,), dtype, 2)
    y = autonorm.layer_norm(x, w, b)
    assert y.shape == (37, 1)
    assert bool((y == b[None, :]).all()), (y.ravel()[:5], b)
    assert bool((autonorm.layer_norm(x, w) == 0).all())
    assert bool((autonorm.layer_norm(x) == 0).all())
    # A single vector of one element is one row.
    assert bool((autonorm.layer_norm(x[0], w, b) == b).all())


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_dimensional_x_is_one_row(cp, dtype):
    x = make(cp, (1000,), dtype)
    w, b = affine(cp, 1000, dtype)
    assert_matches_reference(autonorm.layer_norm(x, w, b), x, w, b, dtype)


# Rows spoiled by non-finite values: (row, column, value). Column 0 is the row's shift.
SPOILED = [(1, 5, np.nan), (3, 100, np.inf), (5, 1023, -np.inf), (6, 0, np.inf),
           (7, 0, np.nan), (9, 7, np.inf), (9, 8, -np.inf)]


def _torch_layer_norm(x: Any, w: Any, b: Any) -> np.ndarray | None:
    """torch.nn.functional.layer_norm on CUDA, or None without a CUDA torch."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    import cupy

    def t(a: Any) -> Any:
        return torch.from_numpy(cupy.asnumpy(a)).cuda()

    out = torch.nn.functional.layer_norm(t(x), (x.shape[-1],), t(w), t(b), EPS)
    return out.float().cpu().numpy()


@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_and_inf_spoil_only_their_own_row(cp, dtype):
    rows, hidden = 16, 1024
    host = 0.5 + np.random.default_rng(0).standard_normal((rows, hidden))
    for row, col, value in SPOILED:
        host[row, col] = value
    x = cp.asarray(host.astype(dtype))
    w, b = affine(cp, hidden, dtype)
    y = cp.asnumpy(autonorm.layer_norm(x, w, b)).astype(np.float64)
    bad = sorted({row for row, _, _ in SPOILED})
    good = [r for r in range(rows) if r not in bad]
    assert np.isnan(y[bad]).all(), {r: int(np.isnan(y[r]).sum()) for r in bad}
    assert np.isfinite(y[good]).all()
    with np.errstate(invalid="ignore"):
        ref = reference(x, w, b)
    assert np.array_equal(np.isnan(y), np.isnan(ref))  # the float64 reference agrees
    err = measure_error(y[good], ref[good])
    assert err.within(dtype), err
    expected = _torch_layer_norm(x, w, b)
    if expected is not None:
        # torch may give -inf/+inf rather than NaN for some elements of a spoiled row; which
        # elements are not finite must agree.
        assert np.array_equal(np.isfinite(y), np.isfinite(expected))
