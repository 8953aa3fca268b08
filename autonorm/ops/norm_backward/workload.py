"""A backward kernel's GPU workload: rotated x and dy, dx, the weight, partials and a counter.

CuPy is imported when a workload is built, never at module import.
"""

from __future__ import annotations

from typing import Any

from autonorm.numerics import from_float64
from autonorm.ops.norm_backward.cases import make_weight
from autonorm.ops.norm_backward.config import BLOCKS_PER_SM
from autonorm.ops.norm_backward.problem import BackwardProblem
from autonorm.ops.norm_backward.verify import GradResult, verify

# eps of every timed and verified launch (the library's default).
EPS = 1e-5


class BackwardWorkload:
    """Rotated inputs of one backward problem on one GPU, for timing and verifying kernels.

    Each rotated set is x and dy (row permutations of two random normal matrices; after a
    residual add also the returned h's gradient) and its own dx; enough sets that their total
    exceeds 3x the L2. The partial rows are sized for the largest grid any configuration
    launches (``BLOCKS_PER_SM`` blocks on every SM, at most one a row), so no launch allocates,
    graph-captured ones included.

    Args:
        problem: what the kernels differentiate.
        rows: rows of the timed input.
        nbytes: bytes one launch must move (the family's ``bytes_moved``).
        device_id: the GPU.
        seed: seed of the random inputs.
    """

    def __init__(
        self, problem: BackwardProblem, rows: int, *, nbytes: int, device_id: int = 0,
        seed: int = 0,
    ) -> None:
        import cupy
        import numpy as np

        from autonorm.runtime import workspace
        from autonorm.runtime.device import query_device
        from autonorm.runtime.timing import rotation_count

        self.problem = problem
        self.rows = rows
        self.nbytes = nbytes
        info = query_device(device_id)
        self.n_sets = rotation_count(3 * rows * problem.hidden * problem.itemsize, info.l2_bytes)
        self._work = workspace.new_counter(device_id)
        rng = np.random.default_rng(seed)
        n = problem.hidden
        with cupy.cuda.Device(device_id):
            x0 = cupy.asarray(from_float64(rng.standard_normal((rows, n)), problem.dtype))
            dy0 = cupy.asarray(from_float64(rng.standard_normal((rows, n)), problem.dtype))
            self._xs = [x0] + [cupy.roll(x0, k + 1, axis=0) for k in range(self.n_sets - 1)]
            self._dys = [cupy.roll(dy0, k, axis=0) for k in range(self.n_sets)]
            self._dxs = [cupy.empty_like(x0) for _ in range(self.n_sets)]
            # The returned h's gradient after a residual add: read once, like dy.
            self._dhs = ([cupy.roll(dy0, -k - 1, axis=0) for k in range(self.n_sets)]
                         if problem.residual else [None] * self.n_sets)
            w64 = make_weight(problem, seed + 1)
            self._w = None if w64 is None else cupy.asarray(from_float64(w64, problem.dtype))
            self._dw = cupy.empty_like(x0[0]) if problem.has_weight else None
            self._db = cupy.empty_like(x0[0]) if problem.has_bias else None
            clusters = info.sm_count * max(BLOCKS_PER_SM)
            self._partials = cupy.empty(problem.partial_floats(rows, clusters),
                                        dtype=cupy.float32)

        def ptr(a: Any) -> int:
            return 0 if a is None else a.data.ptr

        self._args = [
            (x.data.ptr, dy.data.ptr, ptr(self._w), dx.data.ptr, ptr(self._dw), ptr(self._db),
             self._partials.data.ptr, ptr(dh), rows, EPS)
            for x, dy, dx, dh in zip(self._xs, self._dys, self._dxs, self._dhs, strict=True)
        ]
        self._work_ptr = self._work.data.ptr

    def launch(self, kernel: Any, index: int, stream_ptr: int) -> None:
        """Enqueue one launch of ``kernel`` on set ``index`` (below ``n_sets``) on a stream."""
        kernel.launch(self._args[index], stream_ptr, None, self._work_ptr)

    def verify(self, kernel: Any) -> GradResult:
        """Check ``kernel``'s gradients against float64 (:func:`.verify.verify`).

        Raises:
            autonorm.errors.LaunchError: a launch failed (the evaluator classifies it).
        """
        return verify(kernel, self.problem, eps=EPS)
