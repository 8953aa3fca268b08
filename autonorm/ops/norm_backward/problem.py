"""What a norm's backward computes: the gradients of one LayerNorm or RMSNorm shape.

Pure logic: no CuPy, no GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from autonorm.ops.layer_norm.problem import RowProblem


class BackwardProblem(RowProblem):
    """What both backward problems share: the forward they differentiate and their sums.

    Each row's ``dx`` needs only that row (x, dy and the weight); ``dweight`` and ``dbias`` are
    sums over every row, one fp32 column sum each (:attr:`sums`). With ``residual`` the forward
    normalized ``h = x + residual`` and also returned h: x is then h, and the kernel adds the
    gradient of the returned h (``dh``) to dx, which is the gradient of both x and residual.
    """

    hidden: int
    dtype: str
    has_weight: bool
    residual: bool
    norm: ClassVar[str]
    forward_op: ClassVar[str]

    def __repr__(self) -> str:
        # The fields that identify the problem, so that a plain problem (residual=False) keeps
        # the repr, and so the kernel names, it had before the field existed.
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.fields().items())})"

    def _residual_field(self) -> dict[str, Any]:
        """``residual`` as a field of the problem, where it is set."""
        return {"residual": True} if self.residual else {}

    def _residual_words(self) -> str:
        return ", plus the gradient of h = x + residual" if self.residual else ""

    @property
    def sums(self) -> int:
        """The column sums over the rows the kernel returns: dweight, dbias, or both."""
        return int(self.has_weight) + int(self.has_bias)  # type: ignore[attr-defined]

    def partial_floats(self, rows: int, clusters: int) -> int:
        """Return the fp32 elements of the partials buffer of a launch.

        One row of column sums for each of the launch's ``clusters`` clusters (blocks without
        a cluster) that takes one of the ``rows`` rows, or four statistics a row where the
        column sums are formed again from the rows (``acc="reread"``), whichever is more; at
        least one element, so the buffer always exists.
        """
        stats = 4 * rows if self.sums else 0
        return max(1, min(rows, clusters) * self.sums * self.hidden, stats)

    def gradients(self, x: Any, dy: Any, weight: Any | None, eps: float) -> dict[str, Any]:
        """Return the float64 gradients by name (``dx``, ``dweight``, ``dbias``, when they exist).

        Args:
            x: float64 rows (the forward's input).
            dy: float64 gradient of the forward's output.
            weight: float64 weight, or None.
            eps: the forward's eps.
        """
        raise NotImplementedError

    def dx_terms(self, x: Any, dy: Any, weight: Any | None, eps: float) -> Any:
        """Return ``rstd * dy * w`` in float64: the size of the terms dx is a difference of.

        dx = rstd * g - (terms of the same size) cancels where a row has few elements or its
        gradient is nearly parallel to xhat (a row of one element has dx = 0 in exact
        arithmetic); the verifier measures dx's error against these terms as well as against
        dx itself, as any fp32 evaluation of the formula is off by ulps of them.
        """
        from autonorm.numerics import array_module

        xp = array_module(x)
        if self.norm == "rms":
            rstd = 1.0 / xp.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
        else:
            rstd = 1.0 / xp.sqrt(x.var(axis=-1, keepdims=True) + eps)
        g = dy
        if weight is not None:
            g = dy * (1.0 + weight if self.weight_offset else weight)  # type: ignore[attr-defined]
        return rstd * g


@dataclass(frozen=True, repr=False)
class LayerNormBackward(BackwardProblem):
    """The gradients of ``y = (x - mean) / sqrt(var + eps) * weight + bias`` over rows."""

    hidden: int
    dtype: str = "bfloat16"
    has_weight: bool = True
    has_bias: bool = True
    residual: bool = False

    op: ClassVar[str] = "layer_norm_backward"
    forward_op: ClassVar[str] = "layer_norm"
    norm: ClassVar[str] = "layer"
    weight_offset: ClassVar[bool] = False

    def fields(self) -> dict[str, Any]:
        """Return the fields that identify the problem (the tuning DB's problem column)."""
        return {"hidden": self.hidden, "dtype": self.dtype,
                "has_weight": self.has_weight, "has_bias": self.has_bias,
                **self._residual_field()}

    def gradients(self, x: Any, dy: Any, weight: Any | None, eps: float) -> dict[str, Any]:
        """Return the float64 ``dx``, and ``dweight`` and ``dbias`` where the forward has them."""
        from autonorm.ops.layer_norm.reference import layer_norm_backward_reference

        dx, dweight, dbias = layer_norm_backward_reference(x, dy, weight, eps)
        grads = {"dx": dx}
        if self.has_weight:
            grads["dweight"] = dweight
        if self.has_bias:
            grads["dbias"] = dbias
        return grads

    def describe(self) -> str:
        """Return e.g. ``backward of bfloat16 hidden 4096 (weight, bias)``."""
        affine = [name for name, on in (("weight", self.has_weight), ("bias", self.has_bias))
                  if on]
        return (f"backward of {self.dtype} hidden {self.hidden} "
                f"({', '.join(affine) or 'no weight or bias'}{self._residual_words()})")


@dataclass(frozen=True, repr=False)
class RMSNormBackward(BackwardProblem):
    """The gradients of ``y = x / sqrt(mean(x^2) + eps) * w`` (``w`` may be ``1 + weight``)."""

    hidden: int
    dtype: str = "bfloat16"
    has_weight: bool = True
    weight_offset: bool = False
    residual: bool = False

    op: ClassVar[str] = "rms_norm_backward"
    forward_op: ClassVar[str] = "rms_norm"
    norm: ClassVar[str] = "rms"
    has_bias: ClassVar[bool] = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.weight_offset and not self.has_weight:
            raise ValueError("weight_offset scales by 1 + weight: it needs a weight")

    def fields(self) -> dict[str, Any]:
        """Return the fields that identify the problem (the tuning DB's problem column)."""
        return {"hidden": self.hidden, "dtype": self.dtype,
                "has_weight": self.has_weight, "weight_offset": self.weight_offset,
                **self._residual_field()}

    def gradients(self, x: Any, dy: Any, weight: Any | None, eps: float) -> dict[str, Any]:
        """Return the float64 ``dx``, and ``dweight`` where the forward has a weight."""
        from autonorm.ops.rms_norm.reference import rms_norm_backward_reference

        dx, dweight = rms_norm_backward_reference(x, dy, weight, eps, self.weight_offset)
        return {"dx": dx} if dweight is None else {"dx": dx, "dweight": dweight}

    def describe(self) -> str:
        """Return e.g. ``RMSNorm backward of bfloat16 hidden 4096 (weight)``."""
        if not self.has_weight:
            scale = "no weight"
        else:
            scale = "1 + weight" if self.weight_offset else "weight"
        return (f"RMSNorm backward of {self.dtype} hidden {self.hidden} "
                f"({scale}{self._residual_words()})")
