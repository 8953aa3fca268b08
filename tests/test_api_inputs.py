"""CPU tests of autonorm.layer_norm's argument checks (autonorm.api.validate) on NumPy inputs.

Every refusal names the argument at fault, so a caller knows which one to fix.
"""

from __future__ import annotations

import numpy as np
import pytest

from autonorm import api
from autonorm.errors import DeviceMismatchError, InputError, ShapeError, UnsupportedDtypeError

HIDDEN = 16
X = np.linspace(-1, 1, 2 * HIDDEN, dtype=np.float32).reshape(2, HIDDEN)
ONES = np.ones(HIDDEN, np.float32)


@pytest.mark.parametrize("name", ["weight", "bias"])
@pytest.mark.parametrize("value", [[1.0] * HIDDEN, 2.0, 1, (1.0,) * HIDDEN, "ones"])
def test_a_weight_or_bias_that_is_no_array_is_named(name: str, value: object) -> None:
    with pytest.raises(InputError, match=f"^{name} must be a NumPy array of shape \\(16,\\)"):
        api.layer_norm(X, **{name: value})


@pytest.mark.parametrize("name", ["weight", "bias"])
def test_an_array_of_another_kind_is_named(name: str) -> None:
    class OtherArray:  # shape and dtype, but no NumPy array
        shape = (HIDDEN,)
        dtype = np.dtype(np.float32)

    with pytest.raises(DeviceMismatchError, match=f"^{name} must be a NumPy array like x"):
        api.layer_norm(X, **{name: OtherArray()})


@pytest.mark.parametrize("name", ["weight", "bias"])
def test_a_float64_weight_or_bias_is_named(name: str) -> None:
    with pytest.raises(UnsupportedDtypeError, match=f"^{name} has unsupported dtype float64"):
        api.layer_norm(X, **{name: np.ones(HIDDEN, np.float64)})


@pytest.mark.parametrize("name", ["weight", "bias"])
def test_a_weight_or_bias_of_another_supported_dtype_is_named(name: str) -> None:
    with pytest.raises(UnsupportedDtypeError, match=f"^{name} dtype float16 differs"):
        api.layer_norm(X, **{name: np.ones(HIDDEN, np.float16)})


def test_a_float64_x_is_named() -> None:
    with pytest.raises(UnsupportedDtypeError, match="^x has unsupported dtype float64"):
        api.layer_norm(X.astype(np.float64))


@pytest.mark.parametrize(
    "eps", [float("inf"), float("-inf"), float("nan"), 0.0, -1e-5, 0, np.float32("nan")]
)
def test_eps_must_be_finite_and_positive(eps: object) -> None:
    with pytest.raises(InputError, match="^eps must be a finite positive number"):
        api.layer_norm(X, ONES, ONES, eps=eps)


@pytest.mark.parametrize("eps", [True, False, np.bool_(True), "1e-5", None, 1e-5j,
                                 np.array(1e-5), [1e-5]])
def test_eps_must_be_a_real_number_and_not_a_bool(eps: object) -> None:
    with pytest.raises(InputError, match="^eps must be a positive real number"):
        api.layer_norm(X, ONES, ONES, eps=eps)


@pytest.mark.parametrize("eps", [1e-5, 1, np.float32(1e-6), np.float64(1e-3), np.int64(2)])
def test_eps_of_any_real_type_is_taken(eps: object) -> None:
    y = api.layer_norm(X, ONES, None, eps=eps)
    x64 = X.astype(np.float64)
    expected = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True)
                                                              + float(eps))
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(2, 0), (0,)])
def test_hidden_below_one_is_refused(shape: tuple[int, ...]) -> None:
    with pytest.raises(ShapeError, match="hidden size .* at least 1, got 0"):
        api.layer_norm(np.ones(shape, np.float32))


def test_a_zero_dimensional_x_is_refused() -> None:
    with pytest.raises(ShapeError, match="^x must have at least one dimension"):
        api.layer_norm(np.ones((), np.float32))


def test_an_x_that_is_no_array_is_named() -> None:
    with pytest.raises(InputError, match="^x must be a CuPy array, a torch tensor or a NumPy"):
        api.layer_norm([[1.0] * HIDDEN])


def test_validate_returns_dtype_rows_and_hidden() -> None:
    x = np.ones((3, 5, HIDDEN), np.float16)
    assert api.validate(x, None, np.ones(HIDDEN, np.float16), 1e-5) == ("float16", 15, HIDDEN)
