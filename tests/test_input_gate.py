"""CPU: the input checks in front of every kernel launch refuse what a kernel cannot run.

autonorm.api.validate is pure logic; it is tested here on NumPy arrays, directly and through
layer_norm's NumPy path, so no GPU is needed to see a check removed.
"""

from __future__ import annotations

import numpy as np
import pytest

from autonorm import api
from autonorm.errors import InputError, ShapeError, UnsupportedDtypeError

X = np.ones((3, 8), np.float32)


def test_good_arguments_pass_and_describe_the_launch():
    w = np.ones(8, np.float32)
    assert api.validate(X, w, None, 1e-5) == ("float32", 3, 8)
    assert api.validate(np.ones(8, np.float16), None, w.astype(np.float16), 1) == (
        "float16", 1, 8)
    assert api.validate(np.ones((2, 5, 8), np.float32), None, None, 1e-3) == ("float32", 10, 8)
    y = api.layer_norm(X * np.arange(8, dtype=np.float32), w, None, 1e-5)
    assert y.shape == X.shape and y.dtype == X.dtype


@pytest.mark.parametrize("shape", [(3, 0), (0,)])
def test_a_hidden_size_below_one_is_refused(shape):
    x = np.ones(shape, np.float32)
    with pytest.raises(ShapeError):
        api.validate(x, None, None, 1e-5)
    with pytest.raises(ShapeError):
        api.layer_norm(x)


def test_a_scalar_is_refused():
    x = np.array(1.0, np.float32)
    with pytest.raises(ShapeError):
        api.validate(x, None, None, 1e-5)
    with pytest.raises(ShapeError):
        api.layer_norm(x)


@pytest.mark.parametrize("eps", [float("nan"), 0.0, -1e-5, "1e-5", None])
def test_eps_must_be_a_positive_number(eps):
    with pytest.raises(InputError, match="eps"):
        api.validate(X, None, None, eps)
    with pytest.raises(InputError, match="eps"):
        api.layer_norm(X, eps=eps)


@pytest.mark.parametrize("name", ["weight", "bias"])
@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_weight_and_bias_must_have_x_dtype(name, dtype):
    other = np.ones(8, dtype)
    args = {"weight": (other, None), "bias": (None, other)}[name]
    # A supported dtype other than x's: the message names the argument.
    match = name if dtype == np.float16 else None
    with pytest.raises(UnsupportedDtypeError, match=match):
        api.validate(X, *args, 1e-5)
    with pytest.raises(UnsupportedDtypeError, match=match):
        api.layer_norm(X, *args)


@pytest.mark.parametrize("name", ["weight", "bias"])
@pytest.mark.parametrize("shape", [(7,), (9,), (1, 8)])
def test_weight_and_bias_must_match_the_hidden_size(name, shape):
    other = np.ones(shape, np.float32)
    args = {"weight": (other, None), "bias": (None, other)}[name]
    with pytest.raises(ShapeError, match=name):
        api.validate(X, *args, 1e-5)


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.bool_])
def test_unsupported_dtypes_are_refused(dtype):
    with pytest.raises(UnsupportedDtypeError):
        api.validate(np.ones((2, 8), dtype), None, None, 1e-5)
