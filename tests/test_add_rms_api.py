"""Tests of :func:`autonorm.add_rms_norm`: the NumPy path and its argument checks on the CPU, the
CuPy path on a GPU (tests marked ``gpu`` skip themselves without one).

The expected sum is NumPy's own arithmetic in the dtype (one correctly rounded addition) and the
expected norm the float64 formula, both computed here, not by the library.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import autonorm
from autonorm import api_add
from autonorm.errors import DeviceMismatchError, InputError, ShapeError, UnsupportedDtypeError
from autonorm.numerics import measure_error

HIDDEN = 16
BITS = {"float32": np.uint32, "float16": np.uint16}


def expected(h: Any, w: Any, eps: float, offset: bool = False) -> np.ndarray:
    """Float64 RMSNorm of the (already rounded) sum, from the formula."""
    h64 = np.asarray(h, dtype=np.float64)
    y = h64 / np.sqrt(np.mean(h64**2, axis=-1, keepdims=True) + eps)
    if w is not None:
        w64 = np.asarray(w, dtype=np.float64)
        y = y * (1.0 + w64 if offset else w64)
    return y


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bitwise equality (tells -0 from +0, and compares NaNs by payload)."""
    return a.dtype == b.dtype and bool((a.view(BITS[a.dtype.name]) == b.view(BITS[b.dtype.name]))
                                       .all())


def operands(dtype: str, shape: tuple, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """x and residual over many binades, so that many sums round (and some are ties)."""
    rng = np.random.default_rng(seed)
    scale = np.exp2(rng.integers(-6, 7, size=shape))
    x = (rng.standard_normal(shape) * scale).astype(dtype)
    r = (rng.standard_normal(shape) * scale[..., ::-1]).astype(dtype)
    return x, r


def one_line_error(excinfo: pytest.ExceptionInfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message, message
    return message


X, R = operands("float32", (2, HIDDEN))
ONES = np.ones(HIDDEN, np.float32)


# --------------------------------------------------------------------------- NumPy path


def test_add_rms_norm_is_in_the_public_api() -> None:
    assert "add_rms_norm" in autonorm.__all__
    assert autonorm.add_rms_norm is api_add.add_rms_norm


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("form", ["weight", "offset", "none"])
@pytest.mark.parametrize("shape", [(7,), (3, 33), (2, 3, 1001)])
def test_numpy_sum_is_exact_and_the_norm_matches_float64(dtype: str, form: str, shape: tuple):
    x, r = operands(dtype, shape)
    rng = np.random.default_rng(1)
    w = None if form == "none" else (0.5 * rng.standard_normal(shape[-1])).astype(dtype)
    before = (x.copy(), r.copy())
    y, h = autonorm.add_rms_norm(x, r, w, eps=1e-5, weight_offset=form == "offset")
    assert y.shape == h.shape == x.shape and y.dtype == h.dtype == x.dtype
    assert same_bits(h, x + r)  # NumPy adds in the dtype: the correctly rounded sum
    assert not np.shares_memory(y, x) and not np.shares_memory(h, r)
    assert same_bits(x, before[0]) and same_bits(r, before[1])  # the inputs are not written
    tol = {"float32": 1e-6, "float16": 1e-3}[dtype]
    np.testing.assert_allclose(
        y.astype(np.float64), expected(h, w, 1e-5, form == "offset"), rtol=tol, atol=tol
    )
    # y is the norm of exactly the h returned
    assert same_bits(y, autonorm.rms_norm(h, w, eps=1e-5, weight_offset=form == "offset"))


def test_numpy_sum_rounds_ties_to_even_and_overflows_to_inf() -> None:
    one = np.float16(1.0)
    half_ulp = np.float16(2.0**-11)  # 1 + 2^-11 lies halfway between 1 and 1 + 2^-10
    x = np.array([[one, one + np.float16(2.0**-10), 60000.0, -0.0, 6e-8]], np.float16)
    r = np.array([[half_ulp, half_ulp, 60000.0, -0.0, 6e-8]], np.float16)
    # 60000 + 60000 overflows to inf, and its row normalizes to NaN: no warnings for those.
    with np.errstate(over="ignore", invalid="ignore"):
        _, h = autonorm.add_rms_norm(x, r)
        numpy_sum = x + r
    want = np.array([[1.0, 1.0 + 2.0**-9, np.inf, -0.0, 1.2e-7]], np.float16)
    assert same_bits(h, want), h
    assert same_bits(h, numpy_sum)


def test_numpy_in_place_writes_x_and_residual() -> None:
    x, r = operands("float16", (3, 40), seed=2)
    w = np.linspace(0.5, 1.5, 40).astype(np.float16)
    y, h = autonorm.add_rms_norm(x, r, w)
    out = autonorm.add_rms_norm(x, r, w, in_place=True)
    assert out[0] is x and out[1] is r
    assert same_bits(x, y) and same_bits(r, h)


def test_numpy_in_place_into_strided_views() -> None:
    x_base, r_base = operands("float32", (40, 3), seed=3)
    x, r = x_base.T, r_base.T  # (3, 40), strided
    y, h = autonorm.add_rms_norm(x.copy(), r.copy())
    autonorm.add_rms_norm(x, r, in_place=True)
    assert same_bits(np.ascontiguousarray(x), y) and same_bits(np.ascontiguousarray(r), h)


def test_the_functional_form_accepts_x_as_its_own_residual() -> None:
    y, h = autonorm.add_rms_norm(X, X, ONES)
    assert same_bits(h, X + X)
    np.testing.assert_allclose(y, expected(h, ONES, 1e-6), rtol=1e-6)


def test_in_place_refuses_shared_memory() -> None:
    x = X.copy()
    with pytest.raises(InputError) as excinfo:
        autonorm.add_rms_norm(x, x, in_place=True)
    assert one_line_error(excinfo).startswith("residual shares memory with x")
    both = np.zeros((3, HIDDEN), np.float32)
    with pytest.raises(InputError, match="^residual shares memory with x"):
        autonorm.add_rms_norm(both[:2], both[1:], in_place=True)


def test_in_place_refuses_read_only_arrays() -> None:
    x, r = X.copy(), R.copy()
    r.flags.writeable = False
    with pytest.raises(InputError, match="^residual is read-only"):
        autonorm.add_rms_norm(x, r, in_place=True)
    assert same_bits(x, X)  # nothing was written before the refusal


def test_zero_rows_give_empty_results() -> None:
    x = np.ones((0, HIDDEN), np.float32)
    y, h = autonorm.add_rms_norm(x, x.copy(), ONES)
    assert y.shape == h.shape == (0, HIDDEN)


def test_default_eps_is_one_in_a_million() -> None:
    x = np.full((1, 4), 5e-4, np.float32)  # h = 1e-3: mean square 1e-6, which eps halves
    y, h = autonorm.add_rms_norm(x, x)
    np.testing.assert_allclose(y, expected(h, None, 1e-6), rtol=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "error", "start"),
    [
        ({"residual": R[:1]}, ShapeError, "residual must have shape (2, 16) to match x's shape"),
        ({"residual": R.reshape(1, 2, HIDDEN)}, ShapeError, "residual must have shape (2, 16)"),
        ({"residual": R.astype(np.float16)}, UnsupportedDtypeError,
         "residual dtype float16 differs from x dtype float32"),
        ({"residual": R.astype(np.float64)}, UnsupportedDtypeError,
         "residual has unsupported dtype float64"),
        ({"residual": R.tolist()}, InputError, "residual must be a NumPy array of shape (2, 16)"),
        ({"residual": None}, InputError, "residual must be an array of x's shape (2, 16)"),
        ({"weight": np.ones(HIDDEN + 1, np.float32)}, ShapeError, "weight must have shape (16,)"),
        ({"weight": np.ones(HIDDEN, np.float16)}, UnsupportedDtypeError,
         "weight dtype float16 differs"),
        ({"eps": 0.0}, InputError, "eps must be a finite positive number"),
        ({"eps": "1e-6"}, InputError, "eps must be a positive real number"),
        ({"weight_offset": 1}, InputError, "weight_offset must be True or False"),
        ({"weight_offset": True}, InputError, "weight_offset=True scales by 1 + weight"),
        ({"in_place": 1}, InputError, "in_place must be True or False"),
        ({"in_place": None}, InputError, "in_place must be True or False"),
    ],
)
def test_bad_arguments_are_named_in_one_line(kwargs: dict, error: type, start: str) -> None:
    args = {"residual": R, **kwargs}
    with pytest.raises(error) as excinfo:
        autonorm.add_rms_norm(X, **args)
    assert one_line_error(excinfo).startswith(start)


def test_a_residual_of_another_kind_is_named() -> None:
    class OtherArray:  # shape and dtype, but no NumPy array
        shape = (2, HIDDEN)
        dtype = np.dtype(np.float32)

    with pytest.raises(DeviceMismatchError, match="^residual must be a NumPy array like x"):
        autonorm.add_rms_norm(X, OtherArray())


def test_a_bad_x_is_named() -> None:
    with pytest.raises(InputError, match="^x must be a CuPy array, a torch tensor or a NumPy"):
        autonorm.add_rms_norm(X.tolist(), R)
    with pytest.raises(UnsupportedDtypeError, match="^x has unsupported dtype float64"):
        autonorm.add_rms_norm(X.astype(np.float64), R.astype(np.float64))


def test_the_keywords_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        autonorm.add_rms_norm(X, R, ONES, 1e-6, True)


def test_torch_tensors_go_to_autonorm_torch() -> None:
    torch = pytest.importorskip("torch")
    x, r = torch.from_numpy(X.copy()), torch.from_numpy(R.copy())
    w = torch.full((HIDDEN,), 0.5)
    y, h = autonorm.add_rms_norm(x, r, w, eps=1e-5, weight_offset=True)
    assert isinstance(y, torch.Tensor) and isinstance(h, torch.Tensor)
    assert same_bits(h.numpy(), X + R)
    np.testing.assert_allclose(y.numpy(), expected(X + R, w.numpy(), 1e-5, True), rtol=1e-5)
    out = autonorm.add_rms_norm(x, r, w, eps=1e-5, weight_offset=True, in_place=True)
    assert out[0] is x and out[1] is r
    assert torch.equal(x, y) and torch.equal(r, h)
    with pytest.raises(InputError, match="^in_place must be True or False"):
        autonorm.add_rms_norm(x, r, in_place="yes")


# --------------------------------------------------------------------------- CuPy path (GPU)


# Each (dtype, hidden, weight form) compiles one kernel: the tests share (4, 1001).
GPU_HIDDEN = 1001  # odd: no vector width divides it


def gpu_operands(cp: Any, dtype: str, form: str) -> tuple[Any, Any, Any]:
    x, r = operands(dtype, (4, GPU_HIDDEN), seed=5)
    w = None
    if form != "none":
        rng = np.random.default_rng(6)
        w = cp.asarray(((0.0 if form == "offset" else 1.0)
                        + 0.3 * rng.standard_normal(GPU_HIDDEN)).astype(dtype))
    return cp.asarray(x), cp.asarray(r), w


def assert_matches(cp: Any, y: Any, h: Any, x: Any, r: Any, w: Any, eps: float, offset: bool):
    """h is NumPy's sum in the dtype bit for bit; y the float64 norm of h within tolerance."""
    xn, rn = cp.asnumpy(x), cp.asnumpy(r)
    assert same_bits(cp.asnumpy(h), xn + rn)
    ref = expected(xn + rn, None if w is None else cp.asnumpy(w), eps, offset)
    err = measure_error(cp.asnumpy(y).astype(np.float64), ref)
    assert err.within(x.dtype.name), err


# CuPy has no bfloat16: the torch tests check bfloat16 through the same kernels.
@pytest.mark.gpu
@pytest.mark.parametrize(
    ("dtype", "form"), [("float32", "weight"), ("float16", "weight"), ("float32", "offset"),
                        ("float16", "none")]
)
def test_gpu_cupy_matches_the_reference_and_in_place_is_bit_identical(cp: Any, dtype: str,
                                                                       form: str) -> None:
    x, r, w = gpu_operands(cp, dtype, form)
    offset = form == "offset"
    before = (x.copy(), r.copy())
    y, h = autonorm.add_rms_norm(x, r, w, eps=1e-5, weight_offset=offset)
    assert isinstance(y, cp.ndarray) and y.shape == x.shape and y.dtype == x.dtype
    assert bool((x == before[0]).all()) and bool((r == before[1]).all())
    assert_matches(cp, y, h, x, r, w, 1e-5, offset)
    out = autonorm.add_rms_norm(x, r, w, eps=1e-5, weight_offset=offset, in_place=True)
    assert out[0] is x and out[1] is r
    assert same_bits(cp.asnumpy(x), cp.asnumpy(y)) and same_bits(cp.asnumpy(r), cp.asnumpy(h))


@pytest.mark.gpu
def test_gpu_cupy_strided_inputs_in_both_forms(cp: Any) -> None:
    x, r, w = gpu_operands(cp, "float32", "weight")
    xs, rs = cp.asfortranarray(x), cp.asfortranarray(r)  # strided views of the same values
    assert not xs.flags.c_contiguous
    y, h = autonorm.add_rms_norm(xs, rs, w)
    assert_matches(cp, y, h, x, r, w, 1e-6, False)
    autonorm.add_rms_norm(xs, rs, w, in_place=True)  # computed aside, copied back
    assert same_bits(cp.asnumpy(xs), cp.asnumpy(y)) and same_bits(cp.asnumpy(rs), cp.asnumpy(h))


@pytest.mark.gpu
def test_gpu_cupy_errors_and_empty_rows(cp: Any) -> None:
    x, r, w = gpu_operands(cp, "float32", "weight")
    with pytest.raises(DeviceMismatchError, match="^residual must be a CuPy array like x"):
        autonorm.add_rms_norm(x, cp.asnumpy(r), w)
    with pytest.raises(DeviceMismatchError, match="^weight must be a CuPy array"):
        autonorm.add_rms_norm(x, r, cp.asnumpy(w))
    with pytest.raises(InputError, match="^residual shares memory with x"):
        autonorm.add_rms_norm(x, x, w, in_place=True)
    empty = cp.zeros((0, GPU_HIDDEN), cp.float32)
    y, h = autonorm.add_rms_norm(empty, empty.copy(), w)
    assert y.shape == h.shape == (0, GPU_HIDDEN)
