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

    residual: bool
    # float32 beside 16-bit x where the residual add keeps a wide h; problems without the
    # field (the backward's) inherit None.
    residual_dtype: str | None = None

    def __post_init__(self) -> None:
        # Each problem's dataclass __init__ calls it: "bf16" becomes "bfloat16", hidden 0 an error.
        object.__setattr__(self, "dtype", normalize_dtype(self.dtype))
        if not isinstance(self.hidden, int) or self.hidden < 1:
            raise ValueError(f"hidden size must be a positive integer, got {self.hidden!r}")
        self._check_residual_dtype()

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return ITEMSIZE[self.dtype]

    @property
    def full_vec(self) -> int:
        """Elements in one 16-byte access: the widest vector any kernel takes."""
        return 16 // self.itemsize

    @property
    def on_vector_grid(self) -> bool:
        """Whether every row starts on the 16-byte grid: the hidden size a multiple of `full_vec`.

        Rows off it are read skewed (docs/kernels.md).
        """
        return self.hidden % self.full_vec == 0

    @property
    def max_vec(self) -> int:
        """Widest vector (elements): a 16-byte access.

        Rows whose length it does not divide are read skewed: 16-byte accesses for every whole
        vector of a row and narrow ones at its two ends (docs/kernels.md). A float32 residual
        takes no skewed rows, so its widest vector is the widest that divides the hidden size.
        """
        return self.aligned_vec if self.wide_residual else self.full_vec

    @property
    def h_dtype(self) -> str:
        """The dtype of the residual read and of h written: ``residual_dtype`` or the dtype."""
        return self.residual_dtype or self.dtype

    @property
    def h_itemsize(self) -> int:
        """Bytes per element of the residual and of h."""
        return ITEMSIZE[self.h_dtype]

    @property
    def row_io_bytes(self) -> int:
        """Bytes a row reads and writes once: x and y, and the residual and h with the add."""
        h_bytes = 2 * self.h_itemsize if self.residual else 0
        return self.hidden * (2 * self.itemsize + h_bytes)

    @property
    def wide_residual(self) -> bool:
        """True when the residual and h are float32 beside 16-bit x and y (``residual_dtype``)."""
        return self.residual_dtype is not None

    def _check_residual_dtype(self) -> None:
        """Normalize ``residual_dtype``: None when it is the dtype, float32 beside 16-bit x only."""
        rd = self.residual_dtype
        if rd is None:
            return
        rd = normalize_dtype(rd)
        if rd == self.dtype:
            object.__setattr__(self, "residual_dtype", None)
            return
        if not self.residual:
            raise ValueError("residual_dtype is the dtype of the residual add's h: it needs "
                             "residual=True")
        if rd != "float32":
            raise ValueError(f"residual_dtype must be float32 or x's dtype ({self.dtype}), got "
                             f"{rd}")
        object.__setattr__(self, "residual_dtype", rd)

    @property
    def aligned_vec(self) -> int:
        """Widest vector (elements) of at most 16 bytes that divides the hidden size."""
        vec = self.full_vec
        while self.hidden % vec:
            vec //= 2
        return vec


@dataclass(frozen=True, repr=False)
class Problem(RowProblem):
    """What is normalized: rows of ``hidden`` elements of ``dtype`` (x, y, weight and bias).

    With ``residual``, the kernel first adds a residual row of the same dtype, ``h = x +
    residual`` rounded to the dtype, stores ``h`` and normalizes it (``add_layer_norm``). With
    ``residual_dtype`` float32 beside 16-bit x, the residual is read and h stored in float32,
    and h is normalized as its float32 sum (a mixed-precision residual stream).
    """

    hidden: int
    dtype: str = "bfloat16"
    has_weight: bool = True
    has_bias: bool = True
    residual: bool = False
    residual_dtype: str | None = None

    op: ClassVar[str] = "layer_norm"
    norm: ClassVar[str] = "layer"  # the statistic: mean and variance
    weight_offset: ClassVar[bool] = False  # the weight scales as is
    # A model's plan tunes the plain LayerNorm; the residual add is tuned where asked for.
    engines_fuse_residual: ClassVar[bool] = False


    def __repr__(self) -> str:
        # The residual flag only where set: a plain problem's repr, which kernel names hash,
        # stays what it always was.
        add = ", residual=True" if self.residual else ""
        if self.residual_dtype:
            add += f", residual_dtype={self.residual_dtype!r}"
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
        if self.residual_dtype:
            fields["residual_dtype"] = self.residual_dtype
        return fields

    def reference(self, x: Any, weight: Any | None, bias: Any | None, eps: float) -> Any:
        """Return the float64 LayerNorm of float64 ``x`` (what every kernel is verified against)."""
        from autonorm.ops.layer_norm.reference import layer_norm_reference

        return layer_norm_reference(x, weight, bias, eps)

    def describe(self) -> str:
        """Return e.g. ``bfloat16 hidden 4096 (weight, bias)``."""
        flags = (("weight", self.has_weight), ("bias", self.has_bias))
        affine = [name for name, on in flags if on]
        add = describe_residual(self)
        affine_text = ", ".join(affine) or "no weight or bias"
        return f"{add}{self.dtype} hidden {self.hidden} ({affine_text})"


def describe_residual(problem: RowProblem) -> str:
    """``residual + `` (``float32 residual + `` for a wide one), or nothing without the add."""
    if not problem.residual:
        return ""
    return f"{problem.residual_dtype} residual + " if problem.residual_dtype else "residual + "
