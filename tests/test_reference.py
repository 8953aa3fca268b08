"""Tests of the float64 reference, conversions and error measures, and of verify's inputs (CPU)."""

from __future__ import annotations

import numpy as np
import pytest

from autonorm.dtypes import DTYPES
from autonorm.numerics import (
    STORAGE_DTYPE,
    TOLERANCES,
    ErrorReport,
    from_float64,
    measure_error,
    to_float64,
)
from autonorm.ops.layer_norm.config import ROWS_PER_BLOCK
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.reference import (
    chan_merge,
    layer_norm_cpu,
    layer_norm_reference,
    welford,
)
from autonorm.ops.layer_norm.verify import VERIFY_ROWS, make_affine, make_cases


def f32_from_bits(bits: int) -> float:
    return float(np.array([bits], dtype=np.uint32).view(np.float32)[0])


def bf16_of(value: float) -> int:
    return int(from_float64(np.array([value], dtype=np.float64), "bfloat16")[0])


# --------------------------------------------------------------------------- Welford and Chan


def test_chan_merge_two_pairs():
    a = welford([10, 12])
    b = welford([14, 16])
    assert a == (2, 11.0, 2.0)
    assert b == (2, 15.0, 2.0)
    n, mean, m2 = chan_merge(a, b)
    assert n == 4
    assert mean == 13.0
    assert m2 == 20.0
    assert chan_merge(a, b) == welford([10, 12, 14, 16])


def test_chan_merge_with_empty_partial():
    empty = welford([])
    assert empty == (0, 0.0, 0.0)
    part = welford([1.0, 2.0, 6.0])
    assert chan_merge(part, empty) == part
    assert chan_merge(empty, part) == part
    assert chan_merge(empty, empty) == (0, 0.0, 0.0)


def test_welford_known_data():
    n, mean, m2 = welford([2, 4, 4, 4, 5, 5, 7, 9])
    assert n == 8
    assert mean == pytest.approx(5.0, abs=1e-15)
    assert m2 == pytest.approx(32.0, abs=1e-12)  # population variance 4
    assert welford([3.5]) == (1, 3.5, 0.0)
    assert welford(np.full((4, 5), -2.0)) == (20, -2.0, 0.0)


def test_welford_far_from_zero_is_exact():
    data = 1e9 + np.array([4.0, 7.0, 13.0, 16.0])
    n, mean, m2 = welford(data)
    assert (n, mean, m2) == (4, 1e9 + 10.0, 90.0)


def test_chan_merge_of_any_split_matches_welford_and_numpy():
    rng = np.random.default_rng(7)
    data = 1000.0 + 0.1 * rng.standard_normal(1001)
    whole = welford(data)
    assert whole[1] == pytest.approx(data.mean(), rel=1e-15)
    assert whole[2] / whole[0] == pytest.approx(data.var(), rel=1e-9)
    for parts in (2, 3, 7, 32, 1001):
        acc = (0, 0.0, 0.0)
        for chunk in np.array_split(data, parts):
            acc = chan_merge(acc, welford(chunk))
        assert acc[0] == whole[0]
        assert acc[1] == pytest.approx(whole[1], rel=1e-15)
        assert acc[2] == pytest.approx(whole[2], rel=1e-9)
    # tree order (as the kernels reduce): pairwise merges
    partials = [welford(c) for c in np.array_split(data, 16)]
    while len(partials) > 1:
        partials = [chan_merge(partials[i], partials[i + 1]) for i in range(0, len(partials), 2)]
    assert partials[0][2] == pytest.approx(whole[2], rel=1e-9)


# --------------------------------------------------------------------------- the reference


def test_reference_hand_computed():
    x = np.array([[1.0, 2.0, 3.0, 4.0]])
    # mean 2.5, variance (2.25 + 0.25 + 0.25 + 2.25) / 4 = 1.25
    y = layer_norm_reference(x, None, None, 0.0)
    expected = np.array([[-1.5, -0.5, 0.5, 1.5]]) / np.sqrt(1.25)
    np.testing.assert_allclose(y, expected, rtol=1e-15)
    w = np.array([1.0, 2.0, 1.0, 2.0])
    b = np.array([0.0, 0.0, 1.0, 1.0])
    y = layer_norm_reference(x, w, b, 0.75)  # variance + eps = 2: rstd = 1/sqrt(2)
    r = np.sqrt(0.5)
    expected = np.array([[-1.5 * r, -0.5 * r * 2 , 0.5 * r + 1, 1.5 * r * 2 + 1]])
    np.testing.assert_allclose(y, expected, rtol=1e-15)
    np.testing.assert_allclose(y, [[-1.0606601717798212, -0.7071067811865476,
                                    1.3535533905932737, 3.1213203435596424]], rtol=1e-15)


def test_reference_matches_numpy_mean_var():
    rng = np.random.default_rng(3)
    x = 5.0 + 3.0 * rng.standard_normal((2, 5, 37))
    w = rng.standard_normal(37)
    b = rng.standard_normal(37)
    eps = 1e-5
    expected = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps)
    np.testing.assert_allclose(layer_norm_reference(x, None, None, eps), expected, rtol=1e-12)
    np.testing.assert_allclose(layer_norm_reference(x, w, None, eps), expected * w, rtol=1e-12)
    np.testing.assert_allclose(
        layer_norm_reference(x, None, b, eps), expected + b, rtol=1e-12, atol=1e-12
    )
    np.testing.assert_allclose(
        layer_norm_reference(x, w, b, eps), expected * w + b, rtol=1e-12, atol=1e-12
    )


def test_reference_constant_rows_give_the_bias_exactly():
    x = np.full((3, 16), 1234.5678)
    w = np.linspace(0.5, 2.0, 16)
    b = np.linspace(-1.0, 1.0, 16)
    y = layer_norm_reference(x, w, b, 1e-5)
    assert (y == b).all()


def test_layer_norm_cpu_keeps_dtype():
    rng = np.random.default_rng(5)
    for dtype in (np.float32, np.float16):
        x = (100 + rng.standard_normal((4, 64))).astype(dtype)
        w = (1 + 0.1 * rng.standard_normal(64)).astype(dtype)
        b = (0.1 * rng.standard_normal(64)).astype(dtype)
        y = layer_norm_cpu(x, w, b, 1e-5)
        assert y.dtype == dtype and y.shape == x.shape
        ref = layer_norm_reference(
            x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), 1e-5
        )
        np.testing.assert_array_equal(y, ref.astype(dtype))
        y0 = layer_norm_cpu(x, None, None, 1e-5)
        np.testing.assert_allclose(y0.mean(-1), 0.0, atol=1e-2)
        np.testing.assert_allclose(y0.astype(np.float64).std(-1), 1.0, rtol=1e-2)


# --------------------------------------------------------------------------- conversions


@pytest.mark.parametrize(
    ("f32_bits", "bf16_bits"),
    [
        (0x3F800000, 0x3F80),  # 1.0
        (0x3F807FFF, 0x3F80),  # just below the half-way point: down
        (0x3F808000, 0x3F80),  # tie, even below: down to even
        (0x3F808001, 0x3F81),  # just above the half-way point: up
        (0x3F818000, 0x3F82),  # tie, odd below: up to even
        (0x3F817FFF, 0x3F81),
        (0xBF808000, 0xBF80),  # negative tie
        (0xBF818000, 0xBF82),
        (0x00000000, 0x0000),
        (0x80000000, 0x8000),  # -0 keeps its sign
        (0x00008000, 0x0000),  # subnormal tie to even
        (0x00018000, 0x0002),
        (0x7F800000, 0x7F80),  # +inf
        (0xFF800000, 0xFF80),  # -inf
        (0x7F7F7FFF, 0x7F7F),  # largest finite bf16 stays
        (0x7F7FFFFF, 0x7F80),  # float32 max rounds up to inf
        (0x3FFFFFFF, 0x4000),  # carry into the exponent
    ],
)
def test_bf16_round_to_nearest_even(f32_bits, bf16_bits):
    value = f32_from_bits(f32_bits)
    assert bf16_of(value) == bf16_bits


def test_bf16_nan_stays_nan():
    values = np.array([np.nan, -np.nan, f32_from_bits(0x7F800001), f32_from_bits(0xFFFFFFFF),
                       1.0])
    out = from_float64(values, "bfloat16")
    assert out.dtype == np.uint16
    assert (out[:4] == 0x7FC0).all()
    back = to_float64(out, "bfloat16")
    assert np.isnan(back[:4]).all() and back[4] == 1.0


@pytest.mark.filterwarnings("error")  # NaN and inf patterns convert without a RuntimeWarning
def test_bf16_every_pattern_round_trips():
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    values = to_float64(bits, "bfloat16")
    assert values.dtype == np.float64
    back = from_float64(values, "bfloat16")
    finite_or_inf = ~np.isnan(values)
    np.testing.assert_array_equal(back[finite_or_inf], bits[finite_or_inf])
    assert (back[~finite_or_inf] == 0x7FC0).all()
    assert values[0x3F80] == 1.0 and values[0xC000] == -2.0
    assert values[0x7F80] == np.inf and values[0xFF80] == -np.inf


def test_bf16_rounding_from_float64_is_correctly_rounded():
    # Found by this test (double rounding through float32), fixed in from_float64.
    # 1 + 2^-8 is half-way between bf16 1.0 and 1.0078125; 2^-40 above it must round up.
    assert bf16_of(1.0 + 2.0**-8 + 2.0**-40) == 0x3F81
    assert bf16_of(1.0 + 2.0**-8 - 2.0**-40) == 0x3F80
    assert bf16_of(-(1.0 + 2.0**-8 + 2.0**-40)) == 0xBF81
    assert bf16_of(1.0 + 2.0**-8) == 0x3F80  # an exact tie still rounds to even
    assert bf16_of(1.0 + 3 * 2.0**-8) == 0x3F82


def test_fp16_every_pattern_round_trips():
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    stored = bits.view(np.float16)
    values = to_float64(stored, "float16")
    assert values.dtype == np.float64
    back = from_float64(values, "float16")
    assert back.dtype == np.float16
    ok = ~np.isnan(values)
    np.testing.assert_array_equal(back.view(np.uint16)[ok], bits[ok])
    assert np.isnan(back[~ok]).all()
    # round to nearest even, directly from float64
    assert from_float64(np.array([1 + 2.0**-11]), "float16").view(np.uint16)[0] == 0x3C00
    assert from_float64(np.array([1 + 3 * 2.0**-11]), "float16").view(np.uint16)[0] == 0x3C02
    assert from_float64(np.array([1 + 2.0**-11 + 2.0**-40]), "float16").view(np.uint16)[0] == (
        0x3C01
    )


def test_fp32_round_trips():
    rng = np.random.default_rng(11)
    bits = rng.integers(0, 1 << 32, 100_000, dtype=np.uint64).astype(np.uint32)
    stored = bits.view(np.float32)
    with np.errstate(invalid="ignore"):  # signalling NaN patterns
        values = to_float64(stored, "float32")
    back = from_float64(values, "float32")
    assert back.dtype == np.float32
    ok = ~np.isnan(values)
    np.testing.assert_array_equal(back.view(np.uint32)[ok], bits[ok])
    assert np.isnan(back[~ok]).all()
    assert from_float64(np.array([1 + 2.0**-24]), "float32")[0] == np.float32(1.0)  # tie
    assert from_float64(np.array([1 + 3 * 2.0**-24]), "float32")[0] == np.float32(1 + 2.0**-22)


def test_storage_dtypes():
    assert STORAGE_DTYPE == {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}
    for dtype in DTYPES:
        out = from_float64(np.linspace(-3, 3, 7), dtype)
        assert out.dtype == STORAGE_DTYPE[dtype]
        np.testing.assert_allclose(to_float64(out, dtype), np.linspace(-3, 3, 7), rtol=1e-2)


# --------------------------------------------------------------------------- error measures


def test_measure_error_known_differences():
    ref = np.array([[3.0, 4.0]])
    err = measure_error(np.array([[3.0, 4.5]]), ref)
    assert err.rel_l2 == pytest.approx(0.1)  # 0.5 / 5
    assert err.scaled_max == pytest.approx(0.125)  # 0.5 / 4
    assert err.nonfinite == 0
    exact = measure_error(ref.copy(), ref)
    assert exact == ErrorReport(0.0, 0.0, 0)


def test_measure_error_counts_unwritten_elements():
    ref = np.array([1.0, -2.0, np.nan, 2.0])
    y = np.array([np.nan, -2.0, np.nan, np.inf])
    err = measure_error(y, ref)
    assert err.nonfinite == 2  # NaN where the reference is finite, and inf
    assert err.rel_l2 == 0.0 and err.scaled_max == 0.0  # non-finite entries excluded
    assert not err.within("bfloat16")


def test_measure_error_zero_reference():
    err = measure_error(np.array([0.0, 1e-3]), np.zeros(2))
    assert err.rel_l2 == pytest.approx(1e-3)  # absolute when the reference norm is 0
    assert err.scaled_max == 0.0
    empty = measure_error(np.zeros((0, 4)), np.zeros((0, 4)))
    assert empty == ErrorReport(0.0, 0.0, 0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_within_boundaries(dtype):
    tol = TOLERANCES[dtype]
    assert ErrorReport(tol["rel_l2"], tol["scaled_max"], 0).within(dtype)
    assert ErrorReport(0.0, 0.0, 0).within(dtype)
    assert not ErrorReport(tol["rel_l2"] * 1.01, 0.0, 0).within(dtype)
    assert not ErrorReport(0.0, tol["scaled_max"] * 1.01, 0).within(dtype)
    assert not ErrorReport(0.0, 0.0, 1).within(dtype)


def test_within_with_measured_differences():
    rng = np.random.default_rng(2)
    ref = rng.standard_normal((37, 1000))
    scale = np.abs(ref).max()
    y = ref.copy()
    y[5, 7] += 0.5 * TOLERANCES["float32"]["scaled_max"] * scale
    assert measure_error(y, ref).within("float32")
    y[5, 7] += 2.0 * TOLERANCES["float32"]["scaled_max"] * scale
    err = measure_error(y, ref)
    assert not err.within("float32") and err.within("float16")
    noisy = ref * (1 + 5e-3 * rng.standard_normal(ref.shape))  # rel_l2 ~5e-3
    err = measure_error(noisy, ref)
    assert err.within("bfloat16") and not err.within("float16")


def test_tolerances_ordered():
    for key in ("rel_l2", "scaled_max"):
        assert TOLERANCES["float32"][key] < TOLERANCES["float16"][key] < (
            TOLERANCES["bfloat16"][key]
        )
    assert set(TOLERANCES) == set(DTYPES)


@pytest.mark.parametrize("dtype", DTYPES)
def test_correctly_rounded_output_is_within_tolerance(dtype):
    """The tolerance sits above the dtype's own rounding: an exact kernel passes."""
    rng = np.random.default_rng(4)
    x = 1.0 + rng.standard_normal((37, 4096))
    w, b = 1 + 0.1 * rng.standard_normal(4096), 0.1 * rng.standard_normal(4096)
    ref = layer_norm_reference(x, w, b, 1e-5)
    rounded = to_float64(from_float64(ref, dtype), dtype)
    err = measure_error(rounded, ref)
    assert err.within(dtype), err
    assert err.rel_l2 < TOLERANCES[dtype]["rel_l2"] / 2


# --------------------------------------------------------------------------- verify's inputs


@pytest.mark.parametrize("dtype", DTYPES)
def test_make_cases_deterministic(dtype):
    problem = Problem(768, dtype)
    a, b = make_cases(problem), make_cases(problem)
    assert [c.name for c in a] == [c.name for c in b]
    for ca, cb in zip(a, b, strict=True):
        np.testing.assert_array_equal(ca.x, cb.x)
        assert (ca.small_grid, ca.expect_bias) == (cb.small_grid, cb.expect_bias)
    other = make_cases(problem, seed=1)
    assert not np.array_equal(a[0].x, other[0].x)
    wa, ba = make_affine(problem)
    wb, bb = make_affine(problem)
    np.testing.assert_array_equal(wa, wb)
    np.testing.assert_array_equal(ba, bb)
    assert make_affine(Problem(768, dtype, has_weight=False, has_bias=False)) == (None, None)


@pytest.mark.parametrize("dtype", DTYPES)
def test_make_cases_contents(dtype):
    problem = Problem(1000, dtype)
    cases = {c.name: c for c in make_cases(problem)}
    assert {"normal", "normal-one-cluster-grid", "offset", "constant", "large", "tiny"} <= set(
        cases
    )
    for case in cases.values():
        assert case.x.shape == (VERIFY_ROWS, 1000)
        assert case.x.dtype == np.float64
        assert np.isfinite(case.x).all()
    assert cases["normal-one-cluster-grid"].small_grid
    assert not cases["normal"].small_grid
    assert cases["constant"].expect_bias
    assert sum(c.expect_bias for c in cases.values()) == 1
    const = cases["constant"].x
    assert (const == const[:, :1]).all()
    assert len(np.unique(const[:, 0])) == VERIFY_ROWS  # a different value per row
    stored_const = to_float64(from_float64(const, dtype), dtype)
    assert (stored_const == stored_const[:, :1]).all()  # still constant after rounding
    offset = cases["offset"].x
    assert np.abs(offset.mean()) > 10 * offset.std()  # far from zero relative to its spread
    stored = to_float64(from_float64(offset, dtype), dtype)
    assert (stored.std(axis=1) > 0.5 * offset.std(axis=1)).all()  # spread survives rounding
    big = np.abs(cases["large"].x).max()
    small = np.abs(cases["tiny"].x).max()
    assert big >= 1e3 and small <= 1e-2
    assert big / np.abs(cases["normal"].x).max() > 100
    assert np.isfinite(to_float64(from_float64(cases["large"].x, dtype), dtype)).all()
    tiny = to_float64(from_float64(cases["tiny"].x, dtype), dtype)
    assert (tiny != 0).mean() > 0.99  # not flushed to zero


def test_verify_rows_not_divisible_by_any_rows_per_block():
    assert VERIFY_ROWS > max(ROWS_PER_BLOCK)
    for rpb in ROWS_PER_BLOCK:
        if rpb > 1:
            assert VERIFY_ROWS % rpb != 0, rpb
    for case in make_cases(Problem(64, "float32")):
        assert case.x.shape[0] == VERIFY_ROWS


def test_offset_case_breaks_unshifted_one_pass_variance():
    """On the fp32 offset case, E[x^2] - E[x]^2 in fp32 fails the tolerance; a shift passes."""
    problem = Problem(4096, "float32")
    x64 = to_float64(from_float64(make_cases(problem)[2].x, "float32"), "float32")
    assert make_cases(problem)[2].name == "offset"
    ref = layer_norm_reference(x64, None, None, 1e-5)
    x = x64.astype(np.float32)
    n = np.float32(x.shape[1])

    def normalize(mean, var):
        y = (x - mean) / np.sqrt(var + np.float32(1e-5))
        return y.astype(np.float64)

    mean = x.sum(-1, keepdims=True, dtype=np.float32) / n
    var = np.maximum((x * x).sum(-1, keepdims=True, dtype=np.float32) / n - mean * mean, 0)
    assert not measure_error(normalize(mean, var), ref).within("float32")

    shift = x[:, :1]
    d = x - shift
    dmean = d.sum(-1, keepdims=True, dtype=np.float32) / n
    c = d - dmean
    dvar = (c * c).sum(-1, keepdims=True, dtype=np.float32) / n
    y = ((d - dmean) / np.sqrt(dvar + np.float32(1e-5))).astype(np.float64)
    assert measure_error(y, ref).within("float32")
