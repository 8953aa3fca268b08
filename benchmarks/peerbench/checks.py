"""Output checks: an implementation's outputs against the float64 references."""

from __future__ import annotations

import math


def rel_error(y, ref, ref_norm) -> float:
    import torch

    if y.numel() != ref.numel():
        raise ValueError(f"output has {y.numel()} elements, expected {ref.numel()}")
    d = y.reshape(ref.shape).to(torch.float64) - ref
    return float(d.norm() / ref_norm)


def check_outputs(rec: dict, out, refs: tuple, ref_norms: tuple) -> None:
    """Set ``rec``'s errors and status from an implementation's outputs.

    Args:
        rec: the record, its ``tol`` set.
        out: y, or ``(y, h)`` for the fused add.
        refs: the float64 references, ``(y,)`` or ``(y, h)``.
        ref_norms: their L2 norms.

    ``rel_err`` is y's relative L2 error; with h also ``h_rel_err`` and ``h_max_abs_err``, the
    largest absolute difference from the rounded float64 sum (0 for a correctly rounded sum).
    The status is ok where every relative error is within the tolerance, else WRONG.
    """
    import torch

    outs = out if isinstance(out, tuple) else (out,)
    if len(outs) != len(refs):
        raise ValueError(f"{len(outs)} outputs, expected {len(refs)}")
    rec["out_dtype"] = str(outs[0].dtype).replace("torch.", "")
    rec["rel_err"] = rel_error(outs[0], refs[0], ref_norms[0])
    errors = [rec["rel_err"]]
    if len(refs) > 1:
        h, h_ref = outs[1], refs[1]
        rec["h_rel_err"] = rel_error(h, h_ref, ref_norms[1])
        rec["h_max_abs_err"] = float((h.reshape(h_ref.shape).to(torch.float64) - h_ref)
                                     .abs().max())
        errors.append(rec["h_rel_err"])
    ok = all(math.isfinite(e) and e <= rec["tol"] for e in errors)
    rec["status"] = "ok" if ok else "WRONG"


def largest_magnitude(out) -> float:
    """The largest |value| in the outputs; inf where one is not finite (NaN included)."""
    import torch

    outs = out if isinstance(out, tuple) else (out,)
    if not all(bool(torch.isfinite(t).all()) for t in outs):
        return math.inf
    return max(float(t.abs().max()) for t in outs)
