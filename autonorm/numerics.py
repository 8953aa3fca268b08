"""Dtype conversions to and from float64, error measures against a reference, tolerances.

Generic over kernel families: a family's verification rounds its float64 inputs with
:func:`from_float64`, reads outputs back with :func:`to_float64` and compares them with its own
float64 reference through :func:`measure_error` (docs/accuracy.md gives the tolerances' basis).

Array-module agnostic: every function takes NumPy or CuPy arrays and uses the module they came
from (``xp``), so a check can run on the GPU for large verification inputs. No CuPy import at
module import.

bfloat16 is stored as raw ``uint16`` bits (the top half of a float32), so neither NumPy nor CuPy
needs a bfloat16 dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

# Tolerances of the float64 check, per dtype. The output is rounded to its dtype, so the floor is
# that rounding: relative L2 ~ 2^-9 (bf16), 2^-12 (fp16), 2^-25 (fp32) of the values.
#   rel_l2:     ||y - ref|| / ||ref||
#   scaled_max: max |y - ref| / max |ref|
# fp32 allows 2e-6: a correct kernel measures ~5e-8 on rows with mean 1000 and spread 0.1, and
# the unshifted one-pass variant ~1e-1, so the bound separates them by orders of magnitude. Each
# bound sits below the smallest error of a known-broken kernel: the uncorrected fp32 two-pass
# 2.1e-6 (H200, hidden 4096), the unshifted one-pass variance in fp16 2.2e-3, a broken cluster
# mean merge in bf16 on random rows 9.3e-3 (tests/test_verify_gate.py keeps them so).
TOLERANCES: dict[str, dict[str, float]] = {
    "float32": {"rel_l2": 2e-6, "scaled_max": 1e-5},
    "float16": {"rel_l2": 1e-3, "scaled_max": 2e-3},
    "bfloat16": {"rel_l2": 8e-3, "scaled_max": 1.6e-2},
}

STORAGE_DTYPE = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}


def array_module(array: Any) -> Any:
    """Return numpy or cupy, whichever module ``array`` belongs to."""
    module = type(array).__module__
    if module.startswith("cupy"):
        import cupy

        return cupy
    return np


def to_float64(stored: Any, dtype: str) -> Any:
    """Convert stored values (bf16 as uint16 bits) to float64."""
    xp = array_module(stored)
    if dtype == "bfloat16":
        bits = stored.view(xp.uint16).astype(xp.uint32) << 16
        # NaN patterns (poisoned or unwritten outputs) convert to NaN; NumPy would warn of each.
        with np.errstate(invalid="ignore"):
            return bits.view(xp.float32).astype(xp.float64)
    return stored.astype(xp.float64)


def from_float64(values: Any, dtype: str) -> Any:
    """Round float64 values to the storage of ``dtype`` (round to nearest even).

    For bfloat16 the result is uint16 bits; NaN stays NaN.
    """
    xp = array_module(values)
    if dtype == "bfloat16":
        f32 = values.astype(xp.float32)
        bits = f32.view(xp.uint32)
        rounded = (bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16
        # Rounding twice (float64 -> float32 -> bf16) breaks ties the float32 step created: a
        # value just above a bf16 half-way point can land on it and then round to even. Where the
        # float32 bits sit exactly half-way, the float64 residue decides the direction.
        with np.errstate(invalid="ignore"):  # inf - inf: no tie there, NaN compares False
            residue = values - f32.astype(xp.float64)
        tie = ((bits & 0xFFFF) == 0x8000) & (residue != 0)
        away = (residue > 0) == (f32 > 0)  # the true value lies beyond the tie, away from zero
        rounded = xp.where(tie, (bits >> 16) + away.astype(xp.uint32), rounded)
        nan = xp.isnan(f32)
        out = rounded.astype(xp.uint16)
        out[nan] = 0x7FC0
        return out
    return values.astype(STORAGE_DTYPE[dtype])


@dataclass(frozen=True)
class ErrorReport:
    """How far an output is from the reference."""

    rel_l2: float
    scaled_max: float
    nonfinite: int  # elements that are NaN/Inf where the reference is finite (unwritten)

    def within(self, dtype: str) -> bool:
        """True when the errors are inside the tolerances of ``dtype``."""
        tol = TOLERANCES[dtype]
        return (
            self.nonfinite == 0
            and self.rel_l2 <= tol["rel_l2"]
            and self.scaled_max <= tol["scaled_max"]
        )


def measure_error(y: Any, ref: Any) -> ErrorReport:
    """Compare an output (float64) with the float64 reference."""
    xp = array_module(y)
    finite_ref = xp.isfinite(ref)
    bad = int((~xp.isfinite(y) & finite_ref).sum())
    diff = xp.where(finite_ref, y - ref, 0.0)
    diff = xp.where(xp.isfinite(diff), diff, 0.0)
    ref_f = xp.where(finite_ref, ref, 0.0)
    norm = float(xp.sqrt((ref_f * ref_f).sum()))
    dnorm = float(xp.sqrt((diff * diff).sum()))
    scale = float(xp.abs(ref_f).max()) if ref_f.size else 0.0
    rel = dnorm / norm if norm > 0 else dnorm
    smax = float(xp.abs(diff).max()) / scale if scale > 0 and diff.size else 0.0
    return ErrorReport(rel_l2=rel, scaled_max=smax, nonfinite=bad)
