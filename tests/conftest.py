from __future__ import annotations

import fcntl
import tempfile
from pathlib import Path
from typing import Any

import pytest


def _gpu_ok() -> bool:
    from autonorm.runtime.device import gpu_available

    return gpu_available()


def pytest_collection_modifyitems(config, items):  # noqa: ANN001
    """Skip tests marked `gpu` where there is no usable GPU (CI has none)."""
    if not any("gpu" in item.keywords for item in items):
        return
    if _gpu_ok():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU and CuPy")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def gpu_lock_path(run: str) -> Path:
    """The lock file the GPU tests of one pytest-xdist run share (``run``: its testrunuid)."""
    return Path(tempfile.gettempdir()) / f"autonorm-gpu-tests-{run}.lock"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):  # noqa: ANN001
    """Run tests marked `gpu` one at a time under pytest-xdist.

    The README's test command runs a worker a core (``-n auto --dist loadfile``). On a GPU
    machine two workers' GPU tests would share the GPU and each other's timings, so a GPU
    test holds a lock that every worker of the run shares, from its fixtures' setup to their
    teardown (closing the file releases it).
    """
    worker = getattr(item.config, "workerinput", None)
    if worker is None or "gpu" not in item.keywords:
        return (yield)
    with open(gpu_lock_path(worker["testrunuid"]), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        return (yield)


@pytest.fixture
def quiet_optuna():
    """Optuna at WARNING for one test (tuner and isolation tests run many studies)."""
    import optuna

    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    yield
    optuna.logging.set_verbosity(level)


@pytest.fixture(scope="module")
def fresh_db(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Dispatch from an empty user DB (and the shipped one), never the developer's own."""
    from autonorm import dispatch

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AUTONORM_DB", str(tmp_path_factory.mktemp("db") / "user.db"))
        dispatch.clear_cache()
        yield
        dispatch.clear_cache()


@pytest.fixture(scope="module")
def cp(fresh_db: Any) -> Any:
    """CuPy, with dispatch on a fresh user DB (the API tests' GPU arrays); skips without it."""
    return pytest.importorskip("cupy")
