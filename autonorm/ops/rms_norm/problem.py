"""What an RMSNorm forward normalizes: the hidden size, the dtype and the weight's form."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from autonorm.ops.layer_norm.problem import RowProblem, describe_residual


@dataclass(frozen=True, repr=False)
class Problem(RowProblem):
    """Rows of ``hidden`` elements of ``dtype``, scaled by their root mean square.

    ``y = x / sqrt(mean(x^2) + eps) * w``, with ``w`` the weight, ``1 + weight`` where
    ``weight_offset`` (Gemma's form: a weight stored as its offset from one), or one without a
    weight. RMSNorm has no bias. With ``residual``, the kernel first adds a residual row of the
    same dtype, ``h = x + residual`` rounded to the dtype, stores ``h`` and normalizes it; with
    ``residual_dtype`` float32 beside 16-bit x, the residual and h are float32 (h unrounded).
    """

    hidden: int
    dtype: str = "bfloat16"
    has_weight: bool = True
    weight_offset: bool = False
    residual: bool = False
    residual_dtype: str | None = None

    op: ClassVar[str] = "rms_norm"
    norm: ClassVar[str] = "rms"  # the statistic: the mean of squares
    has_bias: ClassVar[bool] = False
    # Inference engines fuse the residual add into every RMSNorm of a decoder but the first
    # (vLLM's and flashinfer's fused_add_rms_norm): a model's plan tunes both forms.
    engines_fuse_residual: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.weight_offset and not self.has_weight:
            raise ValueError("weight_offset scales by 1 + weight: it needs a weight")

    def __repr__(self) -> str:
        # residual_dtype only where set: the repr of every other problem, which kernel names
        # hash, stays what the dataclass wrote before it existed.
        wide = f", residual_dtype={self.residual_dtype!r}" if self.residual_dtype else ""
        return (f"Problem(hidden={self.hidden!r}, dtype={self.dtype!r}, "
                f"has_weight={self.has_weight!r}, weight_offset={self.weight_offset!r}, "
                f"residual={self.residual!r}{wide})")

    def fields(self) -> dict[str, Any]:
        """Return the fields that identify the problem (the tuning DB's problem column)."""
        fields: dict[str, Any] = {
            "hidden": self.hidden, "dtype": self.dtype,
            "has_weight": self.has_weight, "weight_offset": self.weight_offset,
            "residual": self.residual,
        }
        if self.residual_dtype:  # only where set: other problems' keys stay as they were
            fields["residual_dtype"] = self.residual_dtype
        return fields

    def reference(self, x: Any, weight: Any | None, bias: Any | None, eps: float) -> Any:
        """Return the float64 RMSNorm of float64 ``x`` (``bias`` must be None: there is none)."""
        from autonorm.ops.rms_norm.reference import rms_norm_reference

        if bias is not None:
            raise ValueError("RMSNorm takes no bias")
        return rms_norm_reference(x, weight, eps, self.weight_offset)

    def describe(self) -> str:
        """Return e.g. ``bfloat16 hidden 4096 (weight)`` or ``... (1 + weight)``."""
        if not self.has_weight:
            scale = "no weight"
        else:
            scale = "1 + weight" if self.weight_offset else "weight"
        return f"{describe_residual(self)}{self.dtype} hidden {self.hidden} ({scale})"
