"""The search's progress bar on stderr: candidates measured, and the best timing so far."""

from __future__ import annotations

from autonorm.results import Timing


class ProgressBar:
    """A rich progress bar on stderr (trials done / target, best time, GB/s, share of copy).

    Disabled, it does nothing: parallel workers and scripts run quietly.
    """

    def __init__(self, enabled: bool, description: str, total: int) -> None:
        self._bar = None
        self._task = None
        if enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            # stderr: stdout stays clean for the CLI's machine-readable output.
            self._bar = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[best]}"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
            )
            self._task = self._bar.add_task(description, total=max(total, 1), best="")

    def __enter__(self) -> ProgressBar:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def update(self, done: int, best: Timing | None) -> None:
        """Show ``done`` trials and the best timing so far."""
        if self._bar is None:
            return
        text = ""
        if best is not None:
            text = f"best {best.median_us:.2f} us"
            if best.gbps > 0:
                text += f", {best.gbps:.0f} GB/s"
            if best.share > 0:
                text += f" ({100 * best.share:.0f}% of copy)"
        self._bar.update(self._task, completed=done, best=text)
