"""Verification of a backward kernel against float64 gradients: the gate of every candidate.

Each case is launched with every output poisoned (NaN, and a guard row past ``dx``'s end);
``dx``, ``dweight`` and ``dbias`` are compared with the float64 gradients of the rounded inputs,
and the first case is launched twice: the two runs must agree bit for bit.

Array-module agnostic like the forward's gate (``xp``); CuPy by default.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from autonorm.numerics import ErrorReport, from_float64, measure_error, to_float64
from autonorm.ops.layer_norm.verify import VerifyResult as GradResult
from autonorm.ops.norm_backward.cases import Case, make_cases, make_weight
from autonorm.ops.norm_backward.problem import BackwardProblem

__all__ = ["GRAD_TOLERANCES", "GradResult", "Launchable", "verify"]

# Tolerances of the gradients against float64, per dtype. 16-bit outputs: their rounding, as
# the forward's. fp32: dx is a difference of terms of the row's size (g - mean(g) - xhat * c),
# so its error is a few ulp of those terms relative to a result that may be smaller.
GRAD_TOLERANCES: dict[str, dict[str, float]] = {
    "float32": {"rel_l2": 1e-5, "scaled_max": 5e-5},
    "float16": {"rel_l2": 1e-3, "scaled_max": 2e-3},
    "bfloat16": {"rel_l2": 8e-3, "scaled_max": 1.6e-2},
}

_POISON = {"float32": 0xFFFFFFFF, "float16": 0xFFFF, "bfloat16": 0xFFFF}

_BITS = {"float32": "uint32", "float16": "uint16", "bfloat16": "uint16"}


class Launchable(Protocol):
    """What :func:`verify` launches: a compiled kernel (or a stand-in of the array module)."""

    plan: Any

    def launch_arrays(self, *args: Any, grid: int | None = None) -> None:
        """Run on (x, dy, weight, dx, dweight, dbias, partials, dh, rows, eps)."""
        ...

    def grid(self, rows: int) -> int:
        """Blocks launched for ``rows`` rows."""
        ...


def verify(
    kernel: Launchable,
    problem: BackwardProblem,
    *,
    eps: float = 1e-5,
    seed: int = 0,
    xp: Any = None,
    cases: Sequence[Case] | None = None,
) -> GradResult:
    """Run ``kernel`` on every case and check its gradients against float64.

    Raises:
        autonorm.errors.LaunchError: a launch failed (the caller classifies it).
    """
    if xp is None:
        import cupy as xp
    dtype = problem.dtype
    w64 = make_weight(problem, seed + 1)
    w = None if w64 is None else xp.asarray(from_float64(w64, dtype))
    w_ref = None if w is None else to_float64(w, dtype)
    result = GradResult(ok=True)
    first: dict[str, Any] | None = None
    for case in make_cases(problem, seed) if cases is None else cases:
        x = from_float64(xp.asarray(case.x), dtype)
        dy = from_float64(xp.asarray(case.dy), dtype)
        dh = None if case.dh is None else from_float64(xp.asarray(case.dh), dtype)
        got = _launch(kernel, problem, (x, dy, dh, w, eps), case.grid, xp, result, case.name)
        x64, dy64 = to_float64(x, dtype), to_float64(dy, dtype)
        ref = problem.gradients(x64, dy64, w_ref, eps)
        terms = problem.dx_terms(x64, dy64, w_ref, eps)
        if dh is not None:
            # The returned h's gradient joins the norm's: dx of x and of residual alike.
            dh64 = to_float64(dh, dtype)
            ref["dx"] = ref["dx"] + dh64
            terms = xp.maximum(xp.abs(terms), xp.abs(dh64))
        for grad, value in ref.items():
            _compare(result, f"{case.name}/{grad}", got[grad], value, dtype, xp,
                     terms if grad == "dx" else None)
        if first is None:
            again = _launch(kernel, problem, (x, dy, dh, w, eps), case.grid, xp, result,
                            case.name)
            for grad in ref:
                if not bool((again[grad] == got[grad]).all()):
                    result.failures.append(f"{case.name}/{grad}: two runs differ")
            first = got
    result.ok = not result.failures
    return result


def _launch(
    kernel: Launchable, problem: BackwardProblem, inputs: tuple, grid: int | None, xp: Any,
    result: GradResult, name: str,
) -> dict[str, Any]:
    """Launch on one case with poisoned outputs; return the gradients' bits by name.

    ``inputs`` is the case's ``(x, dy, dh, w, eps)`` (``dh`` None without a residual add).
    """
    x, dy, dh, w, eps = inputs
    rows, n = x.shape
    bits = getattr(xp, _BITS[problem.dtype])
    poison = _POISON[problem.dtype]
    dx = xp.full((rows + 1, n), poison, dtype=bits)  # NaN + a guard row
    dw = xp.full(n, poison, dtype=bits) if problem.has_weight else None
    db = xp.full(n, poison, dtype=bits) if problem.has_bias else None
    if grid is not None:
        # A case's grid counts clusters: the blocks of one split each row's columns.
        grid *= getattr(kernel.plan, "cluster", 1)
    blocks = grid if grid is not None else kernel.grid(rows)
    clusters = blocks // getattr(kernel.plan, "cluster", 1)
    partials = xp.full(problem.partial_floats(rows, clusters), float("nan"), dtype=xp.float32)
    kernel.launch_arrays(x, dy, w, dx, dw, db, partials, dh, rows, eps, grid=grid)
    if hasattr(xp, "cuda"):
        xp.cuda.get_current_stream().synchronize()
    if bool((dx[rows] != poison).any()):
        result.failures.append(f"{name}: wrote dx past the last row")
    got = {"dx": dx[:rows]}
    if dw is not None:
        got["dweight"] = dw
    if db is not None:
        got["dbias"] = db
    return got


def _compare(
    result: GradResult, name: str, bits: Any, ref: Any, dtype: str, xp: Any, terms: Any = None,
) -> None:
    """Record the error of one gradient and a failure where it is out of tolerance.

    ``terms``: the size of the terms the gradient is a difference of (dx's ``rstd * g``); the
    error is then relative to the larger of the gradient and those terms.
    """
    if dtype == "float32":
        out = bits.view(xp.float32).astype(xp.float64)
    elif dtype == "float16":
        out = bits.view(xp.float16).astype(xp.float64)
    else:
        out = to_float64(bits, dtype)
    err = measure_error(out, ref)
    if terms is not None and not err.nonfinite:
        diff = out - ref
        norm = max(float(xp.sqrt((ref * ref).sum())), float(xp.sqrt((terms * terms).sum())))
        peak = max(float(xp.abs(ref).max()), float(xp.abs(terms).max()))
        if norm > 0 and peak > 0:
            err = ErrorReport(rel_l2=float(xp.sqrt((diff * diff).sum())) / norm,
                              scaled_max=float(xp.abs(diff).max()) / peak, nonfinite=0)
    result.errors[name] = err
    tol = GRAD_TOLERANCES[dtype]
    if err.nonfinite:
        result.failures.append(f"{name}: {err.nonfinite} elements unwritten or NaN")
    elif err.rel_l2 > tol["rel_l2"] or err.scaled_max > tol["scaled_max"]:
        result.failures.append(
            f"{name}: rel_l2 {err.rel_l2:.2e} (tol {tol['rel_l2']:.0e}), "
            f"scaled_max {err.scaled_max:.2e} (tol {tol['scaled_max']:.0e})"
        )
