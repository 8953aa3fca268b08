"""How a failure is reported and recovered from: a one-line message, a quiet synchronize."""

from __future__ import annotations


def short_error(exc: BaseException, limit: int = 300) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().replace("\n", " | ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def sync_quietly() -> None:
    try:
        import torch

        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001, S110
        pass
