"""What a LayerNorm forward normalizes: the hidden size, the dtype and the affine flags."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from autonorm.dtypes import ITEMSIZE, normalize_dtype


class RowProblem:
    """What every row-norm problem (LayerNorm, RMSNorm) shares: element size and vector widths.

    The row and bulk kernels of :mod:`autonorm.ops.layer_norm` serve every problem with these
    properties and the attributes ``norm`` (``"layer"`` or ``"rms"``), ``has_weight``,
    ``has_bias``, ``weight_offset`` and ``residual``.
    """

    hidden: int
    dtype: str

    def __post_init__(self) -> None:
        # Each problem's dataclass __init__ calls it: "bf16" becomes "bfloat16", hidden 0 an error.
        object.__setattr__(self, "dtype", normalize_dtype(self.dtype))
        if not isinstance(self.hidden, int) or self.hidden < 1:
            raise ValueError(f"hidden size must be a positive integer, got {self.hidden!r}")

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return ITEMSIZE[self.dtype]

    @property
    def max_vec(self) -> int:
        """Widest vector (elements): a 16-byte access.

        Rows whose length it does not divide are read skewed: 16-byte accesses for every whole
        vector of a row and narrow ones at its two ends (docs/kernels.md).
        """
        return 16 // self.itemsize

    @property
    def aligned_vec(self) -> int:
        """Widest vector (elements) of at most 16 bytes that divides the hidden size."""
        vec = 16 // self.itemsize
        while self.hidden % vec:
            vec //= 2
        return vec


@dataclass(frozen=True, repr=False)
class Problem(RowProblem):
    """What is normalized: rows of ``hidden`` elements of ``dtype`` (x, y, weight and bias).

    With ``residual``, the kernel first adds a residual row of the same dtype, ``h = x +
    residual`` rounded to the dtype, stores ``h`` and normalizes it (``add_layer_norm``).
    """

    hidden: int
    dtype: str = "bfloat16"
    has_weight: bool = True
    has_bias: bool = True
    residual: bool = False

    op: ClassVar[str] = "layer_norm"
    norm: ClassVar[str] = "layer"  # the statistic: mean and variance
    weight_offset: ClassVar[bool] = False  # the weight scales as is
    # A model's plan tunes the plain LayerNorm; the residual add is tuned where asked for.
    engines_fuse_residual: ClassVar[bool] = False


    def __repr__(self) -> str:
        # The residual flag only where set: a plain problem's repr, which kernel names hash,
        # stays what it always was.
        add = ", residual=True" if self.residual else ""
        return (f"Problem(hidden={self.hidden!r}, dtype={self.dtype!r}, "
                f"has_weight={self.has_weight!r}, has_bias={self.has_bias!r}{add})")

    def fields(self) -> dict[str, Any]:
        """Return the fields that identify the problem (the tuning DB's problem column)."""
        fields: dict[str, Any] = {
            "hidden": self.hidden, "dtype": self.dtype,
            "has_weight": self.has_weight, "has_bias": self.has_bias,
        }
        # Only where set: the keys of the problems without it stay what they always were.
        if self.residual:
            fields["residual"] = True
        return fields

    def reference(self, x: Any, weight: Any | None, bias: Any | None, eps: float) -> Any:
        """Return the float64 LayerNorm of float64 ``x`` (what every kernel is verified against)."""
        from autonorm.ops.layer_norm.reference import layer_norm_reference

        return layer_norm_reference(x, weight, bias, eps)

    def describe(self) -> str:
        """Return e.g. ``bfloat16 hidden 4096 (weight, bias)``."""
        flags = (("weight", self.has_weight), ("bias", self.has_bias))
        affine = [name for name, on in flags if on]
        add = "residual + " if self.residual else ""
        affine_text = ", ".join(affine) or "no weight or bias"
        return f"{add}{self.dtype} hidden {self.hidden} ({affine_text})"
