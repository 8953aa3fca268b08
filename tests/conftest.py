from __future__ import annotations

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


@pytest.fixture
def quiet_optuna():
    """Optuna at WARNING for one test (tuner and isolation tests run many studies)."""
    import optuna

    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    yield
    optuna.logging.set_verbosity(level)
