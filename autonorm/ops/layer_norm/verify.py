"""Verification of a kernel against the float64 reference: the gate every candidate passes.

Every candidate passes through :func:`verify` before it is timed, on the cases of
:mod:`autonorm.ops.layer_norm.cases`. The output is poisoned with NaN first, plus one guard row
past the end: any element left unwritten, or written out of bounds, fails.

Array-module agnostic: on the GPU the kernel is a compiled one and the arrays are CuPy's; on the
CPU (``xp=numpy``) it can be a kernel written in NumPy
(:mod:`autonorm.ops.layer_norm.emulation`), so the gate itself is tested without a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from autonorm.numerics import TOLERANCES, ErrorReport, from_float64, measure_error, to_float64
from autonorm.ops.layer_norm.cases import (
    OUTLIER_CASE,
    ROW_CASES,
    VERIFY_ROWS,
    Case,
    make_affine,
    make_cases,
)
from autonorm.ops.layer_norm.problem import Problem

__all__ = [
    "OUTLIER_CASE", "ROW_CASES", "VERIFY_ROWS", "Case", "Launchable", "VerifyResult",
    "make_affine", "make_cases", "verify",
]

# NaN in every dtype's storage: what an unwritten element reads as.
_POISON = {"float32": 0xFFFFFFFF, "float16": 0xFFFF, "bfloat16": 0xFFFF}

_BITS = {"float32": "uint32", "float16": "uint16", "bfloat16": "uint16"}


class Launchable(Protocol):
    """What :func:`verify` launches: a compiled kernel, or a NumPy one on the CPU.

    Attributes:
        plan: the launch plan; its ``cluster`` is the grid of the one-cluster case.
    """

    plan: Any

    def launch_arrays(self, *args: Any, grid: int | None = None) -> None:
        """Run on arrays of the caller's array module.

        The arguments are (x, weight, bias, y, rows, eps), or (x, residual, weight, bias, y, h,
        rows, eps) for a residual add.
        """
        ...


@dataclass
class VerifyResult:
    """The outcome of verifying one kernel."""

    ok: bool
    errors: dict[str, ErrorReport] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    @property
    def max_rel_err(self) -> float:
        """The worst relative L2 error over the cases."""
        return max((e.rel_l2 for e in self.errors.values()), default=0.0)

    def summary(self) -> str:
        """One line naming what failed."""
        return "; ".join(self.failures) if self.failures else "ok"


def verify(
    kernel: Launchable,
    problem: Problem,
    *,
    eps: float = 1e-5,
    seed: int = 0,
    xp: Any = None,
    cases: Sequence[Case] | None = None,
) -> VerifyResult:
    """Run ``kernel`` on every case and check it against the float64 reference.

    Args:
        kernel: a :class:`autonorm.runtime.compiler.CompiledKernel` (CuPy arrays), or any
            :class:`Launchable` of the array module ``xp``.
        problem: what the kernel normalizes.
        eps: the launches' eps.
        seed: seed of the cases and of the weight and bias.
        xp: the array module of the launches (None: CuPy).
        cases: the inputs (None: :func:`make_cases` of ``problem`` and ``seed``).

    Raises:
        autonorm.errors.LaunchError: a launch failed (the caller classifies it).

    """
    if xp is None:
        import cupy as xp
    dtype = problem.dtype
    w64, b64 = make_affine(problem, seed + 1)
    w = None if w64 is None else xp.asarray(from_float64(w64, dtype))
    b = None if b64 is None else xp.asarray(from_float64(b64, dtype))
    w_ref = None if w is None else to_float64(w, dtype)
    b_ref = None if b is None else to_float64(b, dtype)
    bits = getattr(xp, _BITS[dtype])
    result = VerifyResult(ok=True)
    for case in make_cases(problem, seed) if cases is None else cases:
        rows, n = case.x.shape
        x = from_float64(xp.asarray(case.x), dtype)  # rounded where it runs (the GPU)
        y = xp.full((rows + 1, n), _POISON[dtype], dtype=bits)  # NaN + a guard row
        grid = kernel.plan.cluster if case.small_grid else None
        if problem.residual:
            x, h_ref = _launch_residual(kernel, case, dtype, problem.h_dtype, w, b, y, eps,
                                        grid, xp, result)
        else:
            kernel.launch_arrays(x, w, b, y, rows, eps, grid=grid)
            if hasattr(xp, "cuda"):
                xp.cuda.get_current_stream().synchronize()
        if bool((y[rows] != _POISON[dtype]).any()):
            result.failures.append(f"{case.name}: wrote past the last row")
        out = _output(y[:rows], dtype, xp)
        ref = problem.reference(
            h_ref if problem.residual else to_float64(x, dtype), w_ref, b_ref, eps)
        err = measure_error(out, ref)
        result.errors[case.name] = err
        if err.nonfinite:
            result.failures.append(f"{case.name}: {err.nonfinite} elements unwritten or NaN")
        elif not err.within(dtype):
            tol = TOLERANCES[dtype]
            result.failures.append(
                f"{case.name}: rel_l2 {err.rel_l2:.2e} (tol {tol['rel_l2']:.0e}), "
                f"scaled_max {err.scaled_max:.2e} (tol {tol['scaled_max']:.0e})"
            )
        if case.expect_bias and problem.norm == "layer":
            expected = b_ref if b_ref is not None else xp.zeros(n)
            if not bool((out == expected[None, :]).all()):
                result.failures.append(f"{case.name}: constant rows must give exactly the bias")
    result.ok = not result.failures
    return result


def _launch_residual(
    kernel: Launchable, case: Case, dtype: str, hdt: str, w: Any, b: Any, y: Any, eps: float,
    grid: int | None, xp: Any, result: VerifyResult,
) -> tuple[Any, Any]:
    """Launch a residual add on ``case``: x is split into a residual half and the rest.

    The case's rows stay what is normalized (up to the rounding of the sum), so each case tests
    what it was made for. The stored h must equal the float64 sum of x and the residual rounded
    to the dtype, bit for bit (one rounding of the sum, as documented). Returns x and the
    float64 values of the expected h, which the reference normalizes.
    """
    rows, n = case.x.shape
    # hdt is h's dtype: x's, or float32 for a wide residual (read and stored as float32).
    residual = from_float64(xp.asarray(0.5 * case.x[::-1].copy()), hdt)  # other rows' halves
    part = from_float64(xp.asarray(case.x) - to_float64(residual, hdt), dtype)
    bits = getattr(xp, _BITS[hdt])
    h = xp.full((rows + 1, n), _POISON[hdt], dtype=bits)
    kernel.launch_arrays(part, residual, w, b, y, h, rows, eps, grid=grid)
    if hasattr(xp, "cuda"):
        xp.cuda.get_current_stream().synchronize()
    if bool((h[rows] != _POISON[hdt]).any()):
        result.failures.append(f"{case.name}: wrote h past the last row")
    # Float64 holds every sum of two float32 (or 16-bit) values exactly, so rounding it once to
    # h's dtype gives the correctly rounded sum the kernel's fp32 add must store.
    expected = from_float64(to_float64(part, dtype) + to_float64(residual, hdt), hdt)
    expected_bits = expected.view(bits)
    if not bool((h[:rows] == expected_bits).all()):
        wrong = int((h[:rows] != expected_bits).sum())
        result.failures.append(f"{case.name}: h differs from x + residual rounded in {wrong} "
                               "elements")
    return part, to_float64(expected, hdt)


def _output(out_bits: Any, dtype: str, xp: Any) -> Any:
    """Read the kernel's output bits back as float64."""
    if dtype == "float32":
        return out_bits.view(xp.float32).astype(xp.float64)
    if dtype == "float16":
        return out_bits.view(xp.float16).astype(xp.float64)
    return to_float64(out_bits, dtype)
