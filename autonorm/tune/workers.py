"""Run one search in several processes, one per local GPU, on a shared study.

Every worker process calls :func:`autonorm.tune.search.tune` on the same study (finals
skipped); the study's bookkeeping (:mod:`autonorm.tune.trials`) keeps them from measuring a
configuration twice, and one more :func:`~autonorm.tune.search.tune` call afterwards runs the
finals once.

A machine with fewer GPUs than workers runs them anyway: :func:`assign_gpus` gives the workers
beyond the GPU count a GPU already taken, round-robin, and :func:`sharing_notice` says so.
Their search timings then share the GPU (a candidate may be timed while another worker's runs);
the finals, run alone afterwards, decide the winner.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from autonorm.tune.storage import storage_scheme

__all__ = [
    "assign_gpus", "check_shared_storage", "run_workers", "sharing_notice",
    "visible_gpu_count",
]

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


def visible_gpu_count() -> int:
    """Return how many GPUs this process sees (after CUDA_VISIBLE_DEVICES), as CuPy counts them.

    CuPy is imported here, at the call, through :func:`autonorm.runtime.device.import_cupy`
    (what :func:`~autonorm.runtime.device.query_device` reads the GPU with): importing this
    module needs no CuPy.

    Raises:
        autonorm.runtime.device.NoGPUError: no CuPy, or no usable GPU.

    """
    from autonorm.runtime.device import import_cupy

    return int(import_cupy().cuda.runtime.getDeviceCount())


def assign_gpus(n_workers: int, n_gpus: int) -> list[int]:
    """Return the GPU index of each worker: one a GPU while they last, then round-robin.

    Args:
        n_workers: number of workers.
        n_gpus: GPUs visible to this process.

    Raises:
        ValueError: no workers, or no GPU.

    """
    if n_workers < 1:
        raise ValueError(f"n_workers must be at least 1, got {n_workers}")
    if n_gpus < 1:
        raise ValueError(f"no GPU to run {n_workers} workers on")
    return [index % n_gpus for index in range(n_workers)]


def sharing_notice(n_workers: int, n_gpus: int) -> str | None:
    """Say which GPUs hold more than one worker, in one line; None when none does.

    E.g. ``2 workers on 1 GPU: workers share GPU 0``.
    """
    gpus = assign_gpus(n_workers, n_gpus)
    shared = sorted({gpu for gpu in gpus if gpus.count(gpu) > 1})
    if not shared:
        return None
    return (f"{n_workers} workers on {n_gpus} GPU{'s' * (n_gpus != 1)}: workers share "
            f"GPU{'s' * (len(shared) != 1)} {', '.join(map(str, shared))}")


def _child_visible_devices(gpu: int | str) -> str:
    """Map a GPU index as this process sees it to a CUDA_VISIBLE_DEVICES value for a child."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        # The parent is already restricted: index into its list, not the physical ordinals.
        ids = [part.strip() for part in visible.split(",") if part.strip()]
        if isinstance(gpu, int) and 0 <= gpu < len(ids):
            return ids[gpu]
    return str(gpu)


def check_shared_storage(n_workers: int, storage_url: str | None) -> None:
    """Refuse a study storage that ``n_workers`` processes cannot share.

    Raises:
        ValueError: SQLite for more than one worker (saying what to use instead).

    """
    if n_workers > 1 and storage_url is not None and storage_scheme(storage_url) == "sqlite":
        raise ValueError(
            f"SQLite storage {storage_url!r} cannot be shared by {n_workers} workers: Optuna "
            "advises against SQLite for parallel optimization (locking errors, lost updates). "
            "Use a journal file instead, e.g. a plain path such as ~/autonorm-study.journal "
            "(or journal:///abs/path), or redis:// across machines."
        )


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
            reuse it round-robin (:func:`assign_gpus` fits them to the GPUs there are). None:
            GPUs 0..n_workers-1.

    Returns:
        The exit code of each worker, in worker order.

    Raises:
        ValueError: no workers or GPUs, or SQLite shared by several workers.

    """
    if n_workers < 1:
        raise ValueError(f"n_workers must be at least 1, got {n_workers}")
    check_shared_storage(n_workers, storage_url)
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
