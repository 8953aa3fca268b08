"""Tests of :func:`autonorm.rms_norm`: the NumPy path and its argument checks on the CPU, the
CuPy path on a GPU (tests marked ``gpu`` skip themselves without one).

The expected values are computed here in float64 from the formula, not by the library's own
reference, so a wrong reference fails these tests too.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import autonorm
from autonorm import api
from autonorm.errors import DeviceMismatchError, InputError, ShapeError, UnsupportedDtypeError
from autonorm.numerics import measure_error

HIDDEN = 16
X = np.linspace(-1, 1, 2 * HIDDEN, dtype=np.float32).reshape(2, HIDDEN)
ONES = np.ones(HIDDEN, np.float32)


def expected(x: Any, w: Any, eps: float, offset: bool = False) -> np.ndarray:
    """Float64 RMSNorm of the (already rounded) inputs, from the formula."""
    x64 = np.asarray(x, dtype=np.float64)
    rms = np.sqrt(np.mean(x64**2, axis=-1, keepdims=True) + eps)
    y = x64 / rms
    if w is not None:
        w64 = np.asarray(w, dtype=np.float64)
        y = y * (1.0 + w64 if offset else w64)
    return y


def one_line_error(excinfo: pytest.ExceptionInfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message, message
    return message


# --------------------------------------------------------------------------- NumPy path


def test_rms_norm_is_in_the_public_api() -> None:
    assert "rms_norm" in autonorm.__all__
    assert autonorm.rms_norm is api.rms_norm


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("form", ["weight", "offset", "none"])
@pytest.mark.parametrize("shape", [(7,), (3, 33), (2, 3, 1001)])
def test_numpy_matches_the_float64_formula(dtype: str, form: str, shape: tuple) -> None:
    rng = np.random.default_rng(0)
    hidden = shape[-1]
    x = (0.3 + rng.standard_normal(shape)).astype(dtype)
    w = None if form == "none" else (0.5 * rng.standard_normal(hidden)).astype(dtype)
    y = autonorm.rms_norm(x, w, eps=1e-5, weight_offset=form == "offset")
    assert y.shape == x.shape and y.dtype == x.dtype
    tol = {"float32": 1e-6, "float16": 1e-3}[dtype]
    np.testing.assert_allclose(
        y.astype(np.float64), expected(x, w, 1e-5, form == "offset"), rtol=tol, atol=tol
    )


def test_the_offset_form_differs_from_the_plain_one() -> None:
    w = np.full(HIDDEN, 0.25, np.float32)
    plain = autonorm.rms_norm(X, w)
    offset = autonorm.rms_norm(X, w, weight_offset=True)
    np.testing.assert_allclose(offset, plain * 5.0, rtol=1e-6)  # (1 + 0.25) / 0.25


def test_default_eps_is_one_in_a_million() -> None:
    x = np.full((1, 4), 1e-3, np.float32)  # mean square 1e-6: eps halves it, visibly
    np.testing.assert_allclose(autonorm.rms_norm(x), expected(x, None, 1e-6), rtol=1e-6)


def test_zero_rows_give_an_empty_result() -> None:
    y = autonorm.rms_norm(np.ones((0, HIDDEN), np.float32), ONES)
    assert y.shape == (0, HIDDEN)


@pytest.mark.parametrize("value", [1, 0, "yes", None, 1.0, np.array(True)])
def test_weight_offset_must_be_a_bool(value: object) -> None:
    with pytest.raises(InputError) as excinfo:
        autonorm.rms_norm(X, ONES, weight_offset=value)
    assert one_line_error(excinfo).startswith("weight_offset must be True or False")


def test_weight_offset_takes_a_numpy_bool() -> None:
    y = autonorm.rms_norm(X, ONES, weight_offset=np.bool_(True))
    np.testing.assert_allclose(y, expected(X, ONES, 1e-6, True), rtol=1e-6)


def test_weight_offset_needs_a_weight() -> None:
    with pytest.raises(InputError) as excinfo:
        autonorm.rms_norm(X, None, weight_offset=True)
    assert one_line_error(excinfo).startswith("weight_offset=True scales by 1 + weight")


def test_weight_offset_is_keyword_only() -> None:
    with pytest.raises(TypeError):
        autonorm.rms_norm(X, ONES, 1e-6, True)


@pytest.mark.parametrize(
    ("kwargs", "error", "start"),
    [
        ({"weight": np.ones(HIDDEN + 1, np.float32)}, ShapeError, "weight must have shape (16,)"),
        ({"weight": np.ones((1, HIDDEN), np.float32)}, ShapeError, "weight must have shape"),
        ({"weight": np.ones(HIDDEN, np.float16)}, UnsupportedDtypeError,
         "weight dtype float16 differs"),
        ({"weight": np.ones(HIDDEN, np.float64)}, UnsupportedDtypeError,
         "weight has unsupported dtype float64"),
        ({"weight": [1.0] * HIDDEN}, InputError, "weight must be a NumPy array of shape (16,)"),
        ({"eps": 0.0}, InputError, "eps must be a finite positive number"),
        ({"eps": float("nan")}, InputError, "eps must be a finite positive number"),
        ({"eps": True}, InputError, "eps must be a positive real number"),
        ({"eps": "1e-6"}, InputError, "eps must be a positive real number"),
    ],
)
def test_bad_arguments_are_named_in_one_line(kwargs: dict, error: type, start: str) -> None:
    with pytest.raises(error) as excinfo:
        autonorm.rms_norm(X, **kwargs)
    assert one_line_error(excinfo).startswith(start)


def test_a_weight_of_another_kind_is_named() -> None:
    class OtherArray:  # shape and dtype, but no NumPy array
        shape = (HIDDEN,)
        dtype = np.dtype(np.float32)

    with pytest.raises(DeviceMismatchError, match="^weight must be a NumPy array like x"):
        autonorm.rms_norm(X, OtherArray())


@pytest.mark.parametrize(
    ("x", "error", "start"),
    [
        (X.astype(np.float64), UnsupportedDtypeError, "x has unsupported dtype float64"),
        (np.ones((), np.float32), ShapeError, "x must have at least one dimension"),
        (np.ones((2, 0), np.float32), ShapeError, "hidden size (last dimension) must be"),
        ([[1.0] * HIDDEN], InputError, "x must be a CuPy array, a torch tensor or a NumPy"),
    ],
)
def test_a_bad_x_is_named_in_one_line(x: object, error: type, start: str) -> None:
    with pytest.raises(error) as excinfo:
        autonorm.rms_norm(x)
    assert one_line_error(excinfo).startswith(start)


def test_torch_tensors_go_to_autonorm_torch() -> None:
    torch = pytest.importorskip("torch")
    x = torch.from_numpy(X.copy())
    w = torch.full((HIDDEN,), 0.5)
    y = autonorm.rms_norm(x, w, eps=1e-5, weight_offset=True)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float32
    np.testing.assert_allclose(y.numpy(), expected(X, w.numpy(), 1e-5, True), rtol=1e-5)
    with pytest.raises(InputError, match="^weight_offset must be True or False"):
        autonorm.rms_norm(x, w, weight_offset=1)


# --------------------------------------------------------------------------- CuPy path (GPU)


def assert_near(y: Any, x: Any, w: Any, eps: float, offset: bool, dtype: str) -> None:
    """Compare a CuPy output with the float64 formula, within the dtype's kernel tolerance."""
    import cupy

    assert isinstance(y, cupy.ndarray) and y.shape == x.shape and y.dtype == np.dtype(dtype)
    ref = expected(cupy.asnumpy(x), None if w is None else cupy.asnumpy(w), eps, offset)
    err = measure_error(cupy.asnumpy(y).astype(np.float64), ref)
    assert err.within(dtype), err


# CuPy has no bfloat16: the torch tests check bfloat16 through the same kernels.
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("form", ["weight", "offset", "none"])
def test_gpu_cupy_matches_the_float64_formula(cp: Any, dtype: str, form: str) -> None:
    hidden = 1001  # odd: no vector width divides it
    rng = np.random.default_rng(0)
    x = cp.asarray((0.5 + rng.standard_normal((4, hidden))).astype(dtype))
    w = None
    if form != "none":
        w = cp.asarray((1.0 + 0.3 * rng.standard_normal(hidden)).astype(dtype))
    before = x.copy()
    y = autonorm.rms_norm(x, w, eps=1e-5, weight_offset=form == "offset")
    assert_near(y, x, w, 1e-5, form == "offset", dtype)
    assert bool((x == before).all())  # the input is never written


@pytest.mark.gpu
def test_gpu_cupy_strided_input_and_errors(cp: Any) -> None:
    rng = np.random.default_rng(1)
    x = cp.asarray(rng.standard_normal((1001, 4)).astype(np.float32)).T  # (4, 1001), strided
    w = cp.asarray(rng.standard_normal(1001).astype(np.float32))
    assert_near(autonorm.rms_norm(x, w), x, w, 1e-6, False, "float32")
    with pytest.raises(DeviceMismatchError, match="^weight must be a CuPy array"):
        autonorm.rms_norm(x, cp.asnumpy(w))
    with pytest.raises(InputError, match="^weight_offset=True scales by 1 \\+ weight"):
        autonorm.rms_norm(x, weight_offset=True)
    assert autonorm.rms_norm(cp.zeros((0, 1001), cp.float32)).shape == (0, 1001)


@pytest.mark.gpu
def test_gpu_cupy_offset_rows_are_exact_in_float32(cp: Any) -> None:
    # Rows with mean 1000 and spread 0.1: the mean of squares needs no shift, so fp32 is fine.
    rng = np.random.default_rng(2)
    x = cp.asarray((1000 + 0.1 * rng.standard_normal((16, 4096))).astype(np.float32))
    y = autonorm.rms_norm(x, eps=1e-5)
    err = measure_error(cp.asnumpy(y).astype(np.float64), expected(cp.asnumpy(x), None, 1e-5))
    assert err.rel_l2 <= 1e-6, err
