"""LayerNorm kernels written in NumPy, right and deliberately wrong, to test the gate on a CPU.

An :class:`EmulatedKernel` computes what the CUDA kernels compute, in their fp32 arithmetic and
order: each thread sums its strided vectors in sequence, the lanes of a warp by a butterfly,
the warps of a row one after another; a cluster splits the row into segments whose
(shift, mean, M2) partials are merged with Chan's formula in rank order, as the bulk-copy
kernel does (docs/accuracy.md, docs/bulk-kernel.md). Statistics are the corrected two-pass in
fp32 and the shifted two-pass in 16-bit, as in the templates; ``fused`` takes the fp32 fused
sums of the few-row kernels (``plan.fuses_passes``) instead.

Its ``fault`` breaks one thing on purpose (:data:`FAULTS`), so that tests can show that
:func:`autonorm.ops.layer_norm.verify.verify` rejects each broken kernel, on the CPU, through
its array-module seam (``xp=numpy``).

NumPy only; nothing here runs on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from autonorm.numerics import from_float64, to_float64
from autonorm.ops.layer_norm.plan import FUSED_SHIFT_ELEMENTS
from autonorm.ops.layer_norm.problem import Problem

# What each fault breaks ("none": a correct kernel).
FAULTS: dict[str, str] = {
    "none": "correct: shifted two-pass statistics (corrected in fp32), Chan's cluster merge",
    "naive": "E[x^2] - E[x]^2 in fp32 without a shift",
    "uncorrected": "fp32 two-pass without its correction: the mean is pass 1's, about the shift",
    "unshifted": "two-pass about zero: pass 1 sums x itself, not x - shift",
    "mean-merge": "the cluster merge keeps rank 0's segment mean as the row's mean",
    "no-between": "the cluster's M2 merge drops Chan's between-segment term",
    "own-mean": "each block normalizes about its own segment's mean (with the merged variance)",
    "tail": "the last element of each row skips weight and bias (a tail path that forgot them)",
    "unwritten": "the last row is never written",
    "past-end": "one row past the last is written (the guard row)",
    "no-grid-stride": "each cluster normalizes its first tile only: no grid-stride loop",
    "unguarded": "fp32 fused statistics that never take the second pass, however much cancels",
}

# The faults of the cluster merge: each needs a cluster of 2 or more.
MERGE_FAULTS = ("mean-merge", "no-between", "own-mean")

_F32 = np.float32


@dataclass(frozen=True)
class EmulatedPlan:
    """The part of a launch plan :func:`~autonorm.ops.layer_norm.verify.verify` reads."""

    cluster: int
    rows_per_block: int


@dataclass(frozen=True)
class EmulatedKernel:
    """A LayerNorm kernel in NumPy, correct or with one fault.

    Attributes:
        problem: what it normalizes.
        fault: one of :data:`FAULTS`.
        cluster: segments a row is split into (blocks of a cluster).
        threads_per_row: threads that sum one segment (a power of two).
        vec: elements per vector access (a thread's consecutive elements).
        rows_per_block: rows of one tile (the grid-stride loop strides by tiles).
        fused: fp32 fused statistics about the mean of the row's first elements, as the
            few-row kernels take them (cluster 1).
    """

    problem: Problem
    fault: str = "none"
    cluster: int = 1
    threads_per_row: int = 256
    vec: int = 4
    rows_per_block: int = 1
    fused: bool = False

    def __post_init__(self) -> None:
        if self.fault not in FAULTS:
            raise ValueError(f"unknown fault {self.fault!r}: one of {', '.join(FAULTS)}")
        if self.fault in MERGE_FAULTS and self.cluster < 2:
            raise ValueError(f"{self.fault} breaks a cluster merge: cluster must be 2 or more")
        if self.problem.hidden % self.cluster:
            raise ValueError("the cluster must divide the hidden size")
        if (self.fused or self.fault == "unguarded") and (
            self.problem.itemsize != 4 or self.cluster != 1
        ):
            raise ValueError("fused fp32 statistics: an fp32 problem and cluster 1")

    @property
    def plan(self) -> EmulatedPlan:
        """The launch plan verify() reads (the one-cluster grid)."""
        return EmulatedPlan(self.cluster, self.rows_per_block)

    def label(self) -> str:
        """Return a short name, e.g. ``no-between-c4``."""
        return f"{self.fault}-c{self.cluster}"

    def launch_arrays(
        self, x: Any, w: Any, b: Any, y: Any, rows: int, eps: float, *, grid: int | None = None
    ) -> None:
        """Normalize ``rows`` rows of x into y (NumPy storage arrays: bf16 as uint16 bits)."""
        dtype = self.problem.dtype
        xf = to_float64(np.asarray(x)[:rows], dtype).astype(_F32)
        wf = None if w is None else to_float64(np.asarray(w), dtype).astype(_F32)
        bf = None if b is None else to_float64(np.asarray(b), dtype).astype(_F32)
        out = from_float64(self._normalize(xf, wf, bf, _F32(eps)).astype(np.float64), dtype)
        written = rows
        if self.fault == "unwritten":
            written = rows - 1
        elif self.fault == "no-grid-stride" and grid is not None:
            written = min(rows, grid // self.cluster * self.rows_per_block)
        y[:written] = out[:written].view(y.dtype)
        if self.fault == "past-end" and rows:
            y[rows] = out[rows - 1].view(y.dtype)

    # -- the arithmetic

    def _normalize(self, x: np.ndarray, w: Any, b: Any, eps: np.float32) -> np.ndarray:
        rows, n = x.shape
        c = self.cluster
        seg = x.reshape(rows, c, n // c)  # [row, rank, element]
        if self.fault == "naive":
            s1 = self._sum(seg).sum(axis=1, dtype=_F32)
            s2 = self._sum(seg * seg).sum(axis=1, dtype=_F32)
            mean = s1 * _F32(1.0 / n)
            var = np.maximum(s2 * _F32(1.0 / n) - mean * mean, _F32(0))
            cshift = np.zeros((rows, c), _F32)
            cmean = np.repeat(mean[:, None], c, axis=1)
        else:
            cshift, cmean, m2 = self._segment_stats(seg)
            cmean, var = self._merge(cshift, cmean, m2, n)
        rstd = _F32(1) / np.sqrt(var + eps)
        r = rstd[:, None, None]
        if self.problem.itemsize == 2:
            v = (seg - cshift[:, :, None]) * r + (-cmean * rstd[:, None])[:, :, None]
        else:
            v = ((seg - cshift[:, :, None]) - cmean[:, :, None]) * r
        v = v.reshape(rows, n)
        plain = v[:, -1].copy()
        if w is not None:
            v = v * w
        if b is not None:
            v = v + b
        if self.fault == "tail":
            v[:, -1] = plain
        return v

    def _segment_stats(self, seg: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each segment's (shift, mean about it, M2) as the two-pass kernels compute them."""
        size = seg.shape[2]
        inv = _F32(1.0 / size)
        if self.fused or self.fault == "unguarded":
            return self._fused_stats(seg, inv)
        shift = np.zeros_like(seg[:, :, 0]) if self.fault == "unshifted" else seg[:, :, 0]
        mean = self._sum(seg - shift[:, :, None]) * inv
        centre = shift + mean
        d = seg - centre[:, :, None]
        s2 = self._sum(d * d)
        if self.problem.itemsize == 2 or self.fault == "uncorrected":
            return shift, mean, s2  # pass 2 about the centre; normalized about the shift
        # fp32: corrected two-pass, about the centre with pass 2's mean of x - centre.
        cmean, m2 = self._corrected(d, s2, inv)
        return centre, cmean, m2

    def _corrected(
        self, d: np.ndarray, s2: np.ndarray, inv: np.float32
    ) -> tuple[np.ndarray, np.ndarray]:
        """fp32's correction of pass 2: the mean of ``d = x - centre``, and the M2 about it.

        ``s2`` is the sum of d's squares.
        """
        cmean = self._sum(d) * inv
        return cmean, np.maximum(s2 - _F32(d.shape[2]) * cmean * cmean, _F32(0))

    def _fused_stats(
        self, seg: np.ndarray, inv: np.float32
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """fp32 fused statistics (``plan.fuses_passes``), as the few-row kernels take them.

        Sums about the mean of the row's first FUSED_SHIFT_ELEMENTS elements (added in order)
        in one pass; the corrected two-pass where the sums would cancel over 2 bits.
        """
        first = seg[:, :, :FUSED_SHIFT_ELEMENTS]
        shift = np.zeros_like(seg[:, :, 0])
        for k in range(first.shape[2]):
            shift = shift + first[:, :, k]
        shift = shift * _F32(1.0 / first.shape[2])
        d = seg - shift[:, :, None]
        s1, s2 = self._sum(d), self._sum(d * d)
        mean = s1 * inv
        m2 = s2 - s1 * mean
        if self.fault == "unguarded":
            return shift, mean, m2
        centre = shift + mean
        dc = seg - centre[:, :, None]
        cmean, cm2 = self._corrected(dc, self._sum(dc * dc), inv)
        second = s1 * mean > _F32(0.75) * s2
        return (np.where(second, centre, shift), np.where(second, cmean, mean),
                np.where(second, cm2, m2))

    def _merge(
        self, cshift: np.ndarray, cmean: np.ndarray, m2: np.ndarray, n: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Chan-merge the segments in rank order; return each block's mean and the variance."""
        c = self.cluster
        size = _F32(n // c)
        s0 = cshift[:, 0]
        count, m_acc, m2_acc = size, cmean[:, 0].copy(), m2[:, 0].copy()
        for r in range(1, c):
            mb = (cshift[:, r] - s0) + cmean[:, r]
            total = count + size
            delta = mb - m_acc
            fb = size / total
            if self.fault != "mean-merge":
                m_acc = m_acc + delta * fb
            m2_acc = m2_acc + m2[:, r]
            if self.fault != "no-between":
                m2_acc = m2_acc + delta * delta * count * fb
            count = total
        var = m2_acc * _F32(1.0 / n)
        if c == 1 or self.fault == "own-mean":
            return cmean, var
        return m_acc[:, None] - (cshift - s0[:, None]), var

    def _sum(self, values: np.ndarray) -> np.ndarray:
        """Sum the last axis in fp32 in the kernels' order: threads, lanes, then warps."""
        rows, c, size = values.shape
        g, v = self.threads_per_row, self.vec
        iters = -(-size // (g * v))
        padded = np.zeros((rows, c, iters * g * v), _F32)
        padded[:, :, :size] = values
        parts = padded.reshape(rows, c, iters, g, v)
        acc = np.zeros((rows, c, g), _F32)
        for it in range(iters):
            for k in range(v):
                acc += parts[:, :, it, :, k]
        lanes = min(g, 32)
        warps = acc.reshape(rows, c, g // lanes, lanes)
        while warps.shape[3] > 1:
            half = warps.shape[3] // 2
            warps = warps[..., :half] + warps[..., half:]
        total = np.zeros((rows, c), _F32)
        for k in range(warps.shape[2]):
            total += warps[:, :, k, 0]
        return total
