"""Run one search in several processes, one per local GPU, on a shared study.

Every worker process calls :func:`autonorm.tune.search.tune` on the same study (finals
skipped); the study's bookkeeping (:mod:`autonorm.tune.trials`) keeps them from measuring a
configuration twice, and one more :func:`~autonorm.tune.search.tune` call afterwards runs the
finals once.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from autonorm.tune.storage import storage_scheme

__all__ = ["run_workers"]

# Children that got the Ctrl-C too are given this long to record their interrupted trials.
_INTERRUPT_GRACE_S = 10


@contextmanager
def _environment(name: str, value: str) -> Iterator[None]:
    """Set an environment variable for the duration (children started inside inherit it)."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def _child_visible_devices(gpu: int | str) -> str:
    """Map a GPU index as this process sees it to a CUDA_VISIBLE_DEVICES value for a child."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        # The parent is already restricted: index into its list, not the physical ordinals.
        ids = [part.strip() for part in visible.split(",") if part.strip()]
        if isinstance(gpu, int) and 0 <= gpu < len(ids):
            return ids[gpu]
    return str(gpu)


def run_workers(
    n_workers: int,
    target: Callable[..., object],
    args: tuple,
    *,
    storage_url: str | None,
    gpus: Sequence[int] | None = None,
) -> list[int]:
    """Run ``target(worker_index, *args)`` in one process per GPU and wait for them.

    Each child is started (spawn, never fork: CUDA does not survive a fork) with
    CUDA_VISIBLE_DEVICES naming its GPU, so the variable is set before the child imports
    anything. ``target`` must be a module-level function and usually calls
    :func:`autonorm.tune.search.tune` with ``worker_index`` and ``TuneSettings(finals_top=0)``
    on the shared study.

    Args:
        n_workers: number of processes.
        target: picklable callable, run as ``target(worker_index, *args)``.
        args: further picklable arguments.
        storage_url: the storage the workers share (checked here: SQLite is refused).
        gpus: GPU index of each worker, as this process sees them; workers beyond the list
            reuse it round-robin. None: GPUs 0..n_workers-1.

    Returns:
        The exit code of each worker, in worker order.

    Raises:
        ValueError: no workers or GPUs, or SQLite shared by several workers.

    """
    if n_workers < 1:
        raise ValueError(f"n_workers must be at least 1, got {n_workers}")
    if n_workers > 1 and storage_url is not None and storage_scheme(storage_url) == "sqlite":
        raise ValueError(
            f"SQLite storage {storage_url!r} cannot be shared by {n_workers} workers: Optuna "
            "advises against SQLite for parallel optimization (locking errors, lost updates). "
            "Use a journal file instead, e.g. a plain path such as ~/autonorm-study.journal "
            "(or journal:///abs/path), or redis:// across machines."
        )
    gpu_ids = list(gpus) if gpus is not None else list(range(n_workers))
    if not gpu_ids:
        raise ValueError("gpus must name at least one GPU")
    context = multiprocessing.get_context("spawn")
    workers = []
    for index in range(n_workers):
        visible = _child_visible_devices(gpu_ids[index % len(gpu_ids)])
        with _environment("CUDA_VISIBLE_DEVICES", visible):
            worker = context.Process(
                target=target, args=(index, *args), name=f"autonorm-tune-{index}"
            )
            worker.start()
        workers.append(worker)
    try:
        for worker in workers:
            worker.join()
    except KeyboardInterrupt:
        # The children got the SIGINT too; let them record their interrupted trials.
        for worker in workers:
            worker.join(timeout=_INTERRUPT_GRACE_S)
        for worker in workers:
            if worker.is_alive():
                worker.terminate()
        raise
    return [worker.exitcode if worker.exitcode is not None else -1 for worker in workers]
