"""A kernel asks the driver for clusters past the portable size, and learns when it is refused.

On the CPU, with a stand-in for the driver library: the attribute and value passed
(``CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED`` = 14, on), and a refusal, a missing
driver or a kernel without a handle all answer False. The GPU side (a kernel of 16 blocks that
launches and verifies) is ``test_gpu_backward_clusters.py``.
"""

from __future__ import annotations

import types

import pytest

from autonorm.runtime import driver


class _Library:
    """Records ``cuFuncSetAttribute`` calls and answers with ``code``."""

    def __init__(self, code: int) -> None:
        self.code = code
        self.calls: list[tuple[int, int, int]] = []

    def cuFuncSetAttribute(self, function, attribute, value) -> int:  # noqa: ANN001, N802
        self.calls.append((function.value, attribute.value, value.value))
        return self.code


@pytest.mark.parametrize(("code", "allowed"), [(0, True), (1, False), (98, False)])
def test_the_kernel_asks_for_non_portable_clusters(monkeypatch, code: int, allowed: bool) -> None:  # noqa: ANN001
    library = _Library(code)
    monkeypatch.setattr(driver, "driver_library", lambda: library)
    assert driver.allow_large_clusters(types.SimpleNamespace(ptr=0x1234)) is allowed
    assert library.calls == [(0x1234, 14, 1)]


def test_without_a_driver_or_a_handle_nothing_is_allowed(monkeypatch) -> None:  # noqa: ANN001
    library = _Library(0)
    monkeypatch.setattr(driver, "driver_library", lambda: None)
    assert driver.allow_large_clusters(types.SimpleNamespace(ptr=0x1234)) is False
    monkeypatch.setattr(driver, "driver_library", lambda: library)
    assert driver.allow_large_clusters(types.SimpleNamespace(ptr=0)) is False
    assert driver.allow_large_clusters(object()) is False
    assert library.calls == []
