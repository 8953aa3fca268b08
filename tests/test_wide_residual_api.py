"""A float32 residual stream beside 16-bit x (``residual_dtype``) in :func:`autonorm.add_rms_norm`
and :func:`autonorm.add_layer_norm`: argument checks and the NumPy path on the CPU, the CuPy path
on a GPU (tests marked ``gpu`` skip themselves without one).

The expected h is the float64 sum rounded once to float32 and the expected y the float64 norm of
that h, both computed here from the formulas, not by the library. NumPy has no bfloat16 without
ml_dtypes, so the CPU values are checked with float16 x; bfloat16's rounding comes from
:mod:`autonorm.numerics` where a test needs it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import autonorm
from autonorm import api_add
from autonorm.errors import InputError, UnsupportedDtypeError
from autonorm.numerics import from_float64, measure_error, to_float64

HIDDEN = 48
NORMS = ["rms", "layer"]
BITS = {"float64": np.uint64, "float32": np.uint32, "float16": np.uint16}


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bitwise equality of two arrays of one dtype (tells -0 from +0)."""
    return a.dtype == b.dtype and bool(
        (a.view(BITS[a.dtype.name]) == b.view(BITS[b.dtype.name])).all()
    )


def operands(shape: tuple, seed: int = 0, dtype: Any = np.float16) -> tuple[Any, Any]:
    """16-bit x and a float32 residual over many binades: their float32 sums rarely fit 16 bits.

    The binades stay within 2^-6..2^6 of each other, so every float64 sum is exact and its one
    rounding to float32 is the correctly rounded sum.
    """
    rng = np.random.default_rng(seed)
    scale = np.exp2(rng.integers(-6, 7, size=shape))
    x = (rng.standard_normal(shape) * scale).astype(dtype)
    r = (rng.standard_normal(shape) * scale[..., ::-1]).astype(np.float32)
    return x, r


def affine(norm: str, dtype: Any = np.float16, seed: int = 1) -> dict:
    rng = np.random.default_rng(seed)
    args = {"weight": (1 + 0.5 * rng.standard_normal(HIDDEN)).astype(dtype)}
    if norm == "layer":
        args["bias"] = (0.1 * rng.standard_normal(HIDDEN)).astype(dtype)
    return args


def call(norm: str, x: Any, r: Any, **kwargs: Any) -> tuple[Any, Any]:
    fn = autonorm.add_rms_norm if norm == "rms" else autonorm.add_layer_norm
    return fn(x, r, **kwargs)


def reference_norm(norm: str, h: Any, weight: Any, bias: Any, eps: float) -> np.ndarray:
    """The norm of h in float64, from its definition."""
    h64 = np.asarray(h, dtype=np.float64)
    if norm == "rms":
        y = h64 / np.sqrt(np.mean(h64 * h64, axis=-1, keepdims=True) + eps)
    else:
        c = h64 - h64.mean(axis=-1, keepdims=True)
        y = c / np.sqrt(np.mean(c * c, axis=-1, keepdims=True) + eps)
    y = y * np.asarray(weight, dtype=np.float64)
    if bias is not None:
        y = y + np.asarray(bias, dtype=np.float64)
    return y


def eps_of(norm: str) -> float:
    return 1e-6 if norm == "rms" else 1e-5


def one_line_error(excinfo: pytest.ExceptionInfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message, message
    return message


X, R = operands((3, HIDDEN))


# --------------------------------------------------------------------------- argument checks


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize(
    ("x", "r", "kwargs", "error", "start"),
    [
        (X, R.astype(np.float64), {}, UnsupportedDtypeError,
         "residual has unsupported dtype float64"),
        (X.astype(np.float32), R.astype(np.float16), {}, UnsupportedDtypeError,
         "residual dtype float16 differs from x dtype float32: it must be x's dtype, or "
         "float32 beside a 16-bit x"),
        (X, R, {"residual_dtype": "float64"}, InputError,
         "residual_dtype must be None, x's dtype (float16) or float32, got 'float64'"),
        (X, R, {"residual_dtype": np.float64}, InputError, "residual_dtype must be None"),
        (X, R, {"residual_dtype": "int8"}, InputError, "residual_dtype must be None"),
        (X, R, {"residual_dtype": 4}, InputError, "residual_dtype must be None"),
        (X, R, {"residual_dtype": True}, InputError, "residual_dtype must be None"),
        (X, R, {"residual_dtype": "bf16"}, InputError,
         "residual_dtype must be None, x's dtype (float16) or float32, got 'bf16'"),
        (X.astype(np.float32), R, {"residual_dtype": "float16"}, InputError,
         "residual_dtype must be None, x's dtype (float32) or float32, got 'float16'"),
        (X, R, {"residual_dtype": "float16"}, InputError,
         "residual_dtype float16 is not supported with a float32 residual: h of a float32 "
         "residual is float32"),
        (X, R, {"residual_dtype": "half", "in_place": True}, InputError,
         "residual_dtype float16 is not supported with a float32 residual"),
        (X, R.astype(np.float16), {"residual_dtype": "float32", "in_place": True}, InputError,
         "residual_dtype float32 needs a float32 residual with in_place=True"),
    ],
    ids=["residual-float64", "residual-wider-than-fp32-x", "rd-float64", "rd-numpy-float64",
         "rd-int8", "rd-int", "rd-bool", "rd-other-16-bit", "rd-fp16-beside-fp32",
         "rd-narrow-for-wide-residual", "rd-narrow-in-place", "rd-wide-in-place"],
)
def test_bad_combinations_are_named_in_one_line(norm: str, x: Any, r: Any, kwargs: dict,
                                                error: type, start: str) -> None:
    before = (x.copy(), r.copy())
    with pytest.raises(error) as excinfo:
        call(norm, x.copy(), r.copy(), **kwargs)
    message = one_line_error(excinfo)
    assert message.startswith(start), message
    assert "residual" in message
    if kwargs.get("in_place") and "needs" in message:
        assert "residual_dtype" in message and "in_place" in message
    assert same_bits(x, before[0]) and same_bits(r, before[1])


def test_the_keyword_is_keyword_only_with_default_none() -> None:
    import inspect

    for fn in (autonorm.add_rms_norm, autonorm.add_layer_norm):
        param = inspect.signature(fn).parameters["residual_dtype"]
        assert param.kind is inspect.Parameter.KEYWORD_ONLY and param.default is None


@pytest.mark.parametrize("alias", ["float32", "fp32", "f32", "float", np.float32,
                                   np.dtype(np.float32)])
def test_aliases_of_float32_are_accepted(alias: Any) -> None:
    y, h = autonorm.add_rms_norm(X, R.astype(np.float16), residual_dtype=alias)
    assert h.dtype == np.float32 and y.dtype == np.float16


def test_a_torch_dtype_is_accepted_for_numpy_arrays() -> None:
    torch = pytest.importorskip("torch")
    y, h = autonorm.add_rms_norm(X, R.astype(np.float16), residual_dtype=torch.float32)
    assert h.dtype == np.float32 and y.dtype == np.float16


def test_x_dtype_as_residual_dtype_changes_nothing() -> None:
    r16 = R.astype(np.float16)
    for rd in (None, "float16", "fp16", np.float16):
        y, h = autonorm.add_rms_norm(X, r16, residual_dtype=rd)
        assert same_bits(h, X + r16) and h.dtype == np.float16
    x32 = X.astype(np.float32)
    y, h = autonorm.add_rms_norm(x32, R, residual_dtype="float32")
    assert same_bits(h, x32 + R) and y.dtype == np.float32


# --------------------------------------------------------------------------- NumPy values


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("shape", [(HIDDEN,), (5, HIDDEN), (2, 3, HIDDEN)])
def test_h_is_the_float32_sum_and_y_the_float64_norm_of_it(norm: str, shape: tuple) -> None:
    x, r = operands(shape, seed=2)
    params = affine(norm)
    eps = eps_of(norm)
    before = (x.copy(), r.copy())
    y, h = call(norm, x, r, eps=eps, **params)
    assert h.dtype == np.float32 and y.dtype == np.float16
    assert y.shape == h.shape == x.shape
    want_h = (x.astype(np.float64) + r.astype(np.float64)).astype(np.float32)
    assert same_bits(h, want_h)
    assert same_bits(x, before[0]) and same_bits(r, before[1])  # the inputs are not written
    ref = reference_norm(norm, want_h, params["weight"], params.get("bias"), eps)
    err = measure_error(y.astype(np.float64), ref)
    assert err.within("float16"), err
    # y is the float64 norm of this h rounded once to x's dtype: the reference's own rounding.
    assert same_bits(y, ref.astype(np.float16))


@pytest.mark.parametrize("norm", NORMS)
def test_a_wrong_h_would_fail_these_checks(norm: str) -> None:
    """The checks above tell the float32 h from one rounded to 16 bits, and y from its norm."""
    x, r = operands((4, HIDDEN), seed=3)
    params = affine(norm)
    eps = eps_of(norm)
    y, h = call(norm, x, r, eps=eps, **params)
    sum64 = x.astype(np.float64) + r.astype(np.float64)
    for wrong in (sum64.astype(np.float16).astype(np.float32),  # h in x's dtype
                  to_float64(from_float64(sum64, "bfloat16"), "bfloat16").astype(np.float32)):
        assert not same_bits(h, wrong)
        assert (h != wrong).mean() > 0.5  # most sums need more than 16 bits
        wrong_y = reference_norm(norm, wrong, params["weight"], params.get("bias"), eps)
        assert not same_bits(y, wrong_y.astype(np.float16))


def test_rounded_sum_rounds_to_hs_dtype() -> None:
    r16 = R.astype(np.float16)
    assert api_add.rounded_sum(X, R).dtype == np.float32  # the residual's dtype
    assert same_bits(api_add.rounded_sum(X, r16), X + r16)
    wide = api_add.rounded_sum(X, r16, np.float32)
    assert same_bits(wide, X.astype(np.float32) + r16.astype(np.float32))
    assert not same_bits(wide.astype(np.float16).astype(np.float32), wide)


@pytest.mark.parametrize("norm", NORMS)
def test_a_16_bit_residual_asked_for_a_float32_h_is_converted_first(norm: str) -> None:
    x, r = operands((4, HIDDEN), seed=4)
    r16 = r.astype(np.float16)
    params = affine(norm)
    y, h = call(norm, x, r16, residual_dtype="float32", **params)
    want_y, want_h = call(norm, x, r16.astype(np.float32), **params)
    assert r16.dtype == np.float16  # the caller's residual is not replaced
    assert same_bits(h, want_h) and same_bits(y, want_y)
    narrow_y, narrow_h = call(norm, x, r16, **params)
    assert narrow_h.dtype == np.float16 and not same_bits(h, narrow_h.astype(np.float32))


@pytest.mark.parametrize("norm", NORMS)
def test_in_place_writes_y_into_x_and_the_float32_h_into_residual(norm: str) -> None:
    x, r = operands((3, HIDDEN), seed=5)
    params = affine(norm)
    y, h = call(norm, x, r, **params)
    out = call(norm, x, r, in_place=True, residual_dtype="float32", **params)
    assert out[0] is x and out[1] is r
    assert same_bits(x, y) and same_bits(r, h)


def test_in_place_into_strided_views_of_a_float32_residual() -> None:
    x_base, r_base = operands((HIDDEN, 3), seed=6)
    x, r = x_base.T, r_base.T
    y, h = autonorm.add_rms_norm(x.copy(), r.copy())
    autonorm.add_rms_norm(x, r, in_place=True)
    assert same_bits(np.ascontiguousarray(x), y) and same_bits(np.ascontiguousarray(r), h)


def test_empty_rows_keep_the_dtypes() -> None:
    x = np.ones((0, HIDDEN), np.float16)
    y, h = autonorm.add_layer_norm(x, np.ones((0, HIDDEN), np.float16), residual_dtype="fp32")
    assert y.shape == h.shape == (0, HIDDEN)
    assert y.dtype == np.float16 and h.dtype == np.float32


def test_bfloat16_numpy_arrays_from_ml_dtypes() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x16, r = operands((3, HIDDEN), seed=7)
    x = x16.astype(np.float32).astype(ml_dtypes.bfloat16)
    y, h = autonorm.add_rms_norm(x, r)
    assert h.dtype == np.float32 and y.dtype == x.dtype
    want_h = (x.astype(np.float64) + r.astype(np.float64)).astype(np.float32)
    assert same_bits(h, want_h)
    ref = reference_norm("rms", want_h, np.ones(HIDDEN), None, 1e-6)
    err = measure_error(y.astype(np.float64), ref)
    assert err.within("bfloat16"), err


# --------------------------------------------------------------------------- CuPy path (GPU)


# CuPy has no bfloat16: the torch tests check bfloat16 x through the same kernels.
@pytest.mark.gpu
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("hidden", [4096, 1000])
def test_gpu_cupy_wide_residual_matches_the_numpy_path(cp: Any, norm: str, hidden: int) -> None:
    rng = np.random.default_rng(8)
    scale = np.exp2(rng.integers(-6, 7, size=(4, hidden)))
    x = (rng.standard_normal((4, hidden)) * scale).astype(np.float16)
    r = (rng.standard_normal((4, hidden)) * scale[..., ::-1]).astype(np.float32)
    params = {"weight": (1 + 0.5 * rng.standard_normal(hidden)).astype(np.float16)}
    if norm == "layer":
        params["bias"] = (0.1 * rng.standard_normal(hidden)).astype(np.float16)
    eps = eps_of(norm)
    gpu_params = {k: cp.asarray(v) for k, v in params.items()}
    xg, rg = cp.asarray(x), cp.asarray(r)
    y, h = call(norm, xg, rg, eps=eps, **gpu_params)
    assert y.dtype == np.float16 and h.dtype == np.float32
    want_h = (x.astype(np.float64) + r.astype(np.float64)).astype(np.float32)
    assert same_bits(cp.asnumpy(h), want_h)
    ref = reference_norm(norm, want_h, params["weight"], params.get("bias"), eps)
    err = measure_error(cp.asnumpy(y).astype(np.float64), ref)
    assert err.within("float16"), err
    out = call(norm, xg, rg, eps=eps, in_place=True, **gpu_params)
    assert out[0] is xg and out[1] is rg
    assert same_bits(cp.asnumpy(xg), cp.asnumpy(y)) and same_bits(cp.asnumpy(rg), want_h)
    # A 16-bit residual asked for a float32 h gives the same bits as its float32 copy.
    r16 = r.astype(np.float16)
    y2, h2 = call(norm, cp.asarray(x), cp.asarray(r16), eps=eps, residual_dtype="float32",
                  **gpu_params)
    y3, h3 = call(norm, cp.asarray(x), cp.asarray(r16.astype(np.float32)), eps=eps,
                  **gpu_params)
    assert same_bits(cp.asnumpy(h2), cp.asnumpy(h3)) and same_bits(cp.asnumpy(y2), cp.asnumpy(y3))
