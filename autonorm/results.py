"""Plain records passed between the evaluator (compile, verify, time) and the tuner.

Pure data: no CuPy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# Why a candidate failed. "invalid" is decided before compiling (the family's check);
# "compile" is NVRTC/nvcc; "launch" is a launch error or a GPU fault; "verification" is a
# result that disagrees with the float64 reference.
FailureClass = Literal["invalid", "compile", "launch", "verification"]
FAILURE_CLASSES: tuple[str, ...] = ("invalid", "compile", "launch", "verification")


@dataclass(frozen=True)
class Timing:
    """Measured speed of one kernel on one shape.

    Attributes:
        median_us: median time of one launch, microseconds.
        p20_us: 20th percentile, microseconds.
        p80_us: 80th percentile, microseconds.
        cv: coefficient of variation of the samples (std / mean).
        gbps: bytes that must move (the family's ``bytes_moved``) / median time, GB/s.
        share: gbps over the copy bandwidth measured on the same device (0..1), or 0 if unknown.
        samples: number of timed samples behind the statistics.

    """

    median_us: float
    p20_us: float
    p80_us: float
    cv: float
    gbps: float
    share: float = 0.0
    samples: int = 0

    @property
    def copy_gbps(self) -> float:
        """The copy bandwidth the share is of, in GB/s (0 if unknown).

        The finals may divide by a copy of the problem's own bytes timed in single launches,
        not by the evaluator's back-to-back copy.
        """
        return self.gbps / self.share if self.share else 0.0

    def metrics(self, **extra: object) -> dict[str, object]:
        """Return the timing as the metrics dict stored in the tuning DB, plus ``extra``."""
        return {
            "median_us": self.median_us, "p20_us": self.p20_us, "p80_us": self.p80_us,
            "cv": self.cv, "gbps": self.gbps, "share": self.share, **extra,
        }


@dataclass(frozen=True)
class Outcome:
    """What evaluating one candidate produced: a timing, or a classified failure."""

    status: Literal["ok", "invalid", "compile", "launch", "verification"]
    timing: Timing | None = None
    error: str | None = None
    max_rel_err: float | None = None  # worst relative L2 error over the verification cases

    @property
    def ok(self) -> bool:
        """True when the candidate verified and was timed."""
        return self.status == "ok" and self.timing is not None
