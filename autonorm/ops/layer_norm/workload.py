"""LayerNorm's GPU workload: the inputs its kernels are timed on, and their verification.

:class:`LayerNormWorkload` is what :meth:`LayerNormFamily.workload` hands the GPU evaluator
(:class:`autonorm.tune.evaluator.Workload`): rotated sets of x and y, one weight and bias, and
one tile counter, allocated once per problem and row count and launched for every candidate.
CuPy is imported when a workload is built, never at module import.
"""

from __future__ import annotations

from typing import Any

from autonorm.numerics import from_float64
from autonorm.ops.layer_norm.cases import Case, make_cases
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.verify import VerifyResult, verify

# eps of every timed and verified launch (the library's default).
EPS = 1e-5


class LayerNormWorkload:
    """Rotated inputs of one LayerNorm problem on one GPU, for timing and verifying kernels.

    Each rotated set is x (a permutation of the rows of one random normal matrix: real data,
    never zeros, cheap to make) and its own y; enough sets that their total exceeds 3x the L2
    (:func:`autonorm.runtime.timing.rotation_count`), so no timed launch reads a warm L2.

    Attributes:
        problem: what the kernels normalize.
        rows: rows of every set.
        nbytes: bytes one launch must move (x read, y written, weight and bias read once).
        n_sets: the number of rotated sets.

    Args:
        problem: what the kernels normalize.
        rows: rows of the timed input.
        nbytes: bytes one launch must move (the family's ``bytes_moved``).
        device_id: the GPU.
        seed: seed of the random inputs.
    """

    def __init__(
        self, problem: Problem, rows: int, *, nbytes: int, device_id: int = 0, seed: int = 0
    ) -> None:
        import cupy
        import numpy as np

        from autonorm.runtime import workspace
        from autonorm.runtime.device import query_device
        from autonorm.runtime.timing import rotation_count

        self.problem = problem
        self.rows = rows
        self.nbytes = nbytes
        # x and y, and with the residual add its input and h
        per_set = rows * problem.row_io_bytes
        self.n_sets = rotation_count(per_set, query_device(device_id).l2_bytes)
        # One tile counter for every launch here, graph-captured ones too (the bulk kernel's
        # dynamic schedule, as dispatch runs it): these launches never overlap.
        self._work = workspace.new_counter(device_id)
        rng = np.random.default_rng(seed)
        with cupy.cuda.Device(device_id):
            base = rng.standard_normal((rows, problem.hidden))
            x0 = cupy.asarray(from_float64(base, problem.dtype))
            self._xs = [x0] + [cupy.roll(x0, k + 1, axis=0) for k in range(self.n_sets - 1)]
            self._ys = [cupy.empty_like(x0) for _ in range(self.n_sets)]
            if problem.residual:
                r0 = cupy.asarray(from_float64(rng.standard_normal((rows, problem.hidden)),
                                               problem.h_dtype))
                self._rs = [cupy.roll(r0, k, axis=0) for k in range(self.n_sets)]
                self._hs = [cupy.empty_like(r0) for _ in range(self.n_sets)]
            w = from_float64(1.0 + 0.1 * rng.standard_normal(problem.hidden), problem.dtype)
            b = from_float64(0.1 * rng.standard_normal(problem.hidden), problem.dtype)
            self._w = cupy.asarray(w) if problem.has_weight else None
            self._b = cupy.asarray(b) if problem.has_bias else None
        wp = 0 if self._w is None else self._w.data.ptr
        bp = 0 if self._b is None else self._b.data.ptr
        # The launch arguments of each set, made once: a timed loop only indexes them.
        if problem.residual:
            # The residual kernels' order: x, residual, weight, bias, y, h, rows, eps.
            self._args = [
                (x.data.ptr, r.data.ptr, wp, bp, y.data.ptr, h.data.ptr, rows, EPS)
                for x, r, y, h in zip(self._xs, self._rs, self._ys, self._hs, strict=True)
            ]
        else:
            self._args = [
                (x.data.ptr, wp, bp, y.data.ptr, rows, EPS)
                for x, y in zip(self._xs, self._ys, strict=True)
            ]
        self._work_ptr = self._work.data.ptr
        self._cases: list[Case] | None = None

    def launch(self, kernel: Any, index: int, stream_ptr: int) -> None:
        """Enqueue one launch of ``kernel`` on set ``index`` (below ``n_sets``) on a stream."""
        kernel.launch(self._args[index], stream_ptr, None, self._work_ptr)

    def verify(self, kernel: Any) -> VerifyResult:
        """Check ``kernel`` against the float64 reference on the verification cases.

        Raises:
            autonorm.errors.LaunchError: a launch failed (the evaluator classifies it).

        """
        if self._cases is None:
            # Made once per workload: every candidate is verified on the same inputs.
            self._cases = make_cases(self.problem)
        return verify(kernel, self.problem, eps=EPS, cases=self._cases)
