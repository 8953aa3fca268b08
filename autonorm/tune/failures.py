"""The candidates a tune saw fail on the GPU, named, so that a user can look at one.

The search counts failures by class (``TuneResult.failures``); the database keeps every
recorded trial with its error (:meth:`autonorm.store.db.TuningDB.trials`). :func:`failed_candidates`
reads those back for one key, and :func:`describe_failed` turns the first few into lines for
the command line. Pure logic over the database: no GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from autonorm.results import FAILURE_CLASSES
from autonorm.store.db import TuningDB, TuningKey

# Failure classes found only by running a candidate; "invalid" is the rules' refusal before
# any GPU work, counted but not named.
GPU_FAILURES = tuple(kind for kind in FAILURE_CLASSES if kind != "invalid")

# How the command line words each class.
FAILURE_WORDS = {"compile": "failed to compile", "launch": "failed at launch",
                 "verification": "failed verification"}

# The longest error text a line repeats, so that a line stays one terminal line; the whole
# error stays in the trials table.
ERROR_CHARS = 160


@dataclass(frozen=True)
class FailedCandidate:
    """One configuration whose newest recorded trial failed on the GPU.

    Attributes:
        failure: its class, one of :data:`GPU_FAILURES`.
        label: the configuration's label.
        error: the first line of the recorded error ("" when none was recorded).
    """

    failure: str
    label: str
    error: str


def failed_candidates(
    db: TuningDB, key: TuningKey, study: str
) -> tuple[FailedCandidate, ...]:
    """Return the candidates of ``key`` whose newest trial in ``study`` failed on the GPU.

    Newest first, one entry a configuration. Only ``study``'s trials count, as the search's
    failure counts do: a study is one code version's, so a failure of older code is not
    repeated once the code that failed has changed.
    """
    newest: dict[str, dict] = {}
    for row in reversed(db.trials(key)):
        if row["study"] == study:
            newest.setdefault(row["label"], row)
    return tuple(
        FailedCandidate(row["status"], row["label"], _first_line(row["error"], row["label"]))
        for row in newest.values() if row["status"] in GPU_FAILURES
    )


def describe_failed(failed: tuple[FailedCandidate, ...], shown: int = 3) -> list[str]:
    """Return a line for each of the first ``shown`` failed candidates, and one for the rest."""
    lines = []
    for candidate in failed[:shown]:
        words = FAILURE_WORDS.get(candidate.failure, candidate.failure)
        error = f": {candidate.error}" if candidate.error else ""
        lines.append(f"{words}: {candidate.label}{error}")
    if len(failed) > shown:
        lines.append(f"and {len(failed) - shown} more (the database's trials table has each)")
    return lines


def _first_line(error: str | None, label: str) -> str:
    """The error's first non-blank line, without the label a compile error starts with."""
    text = (error or "").removeprefix(f"{label}:")
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    return line if len(line) <= ERROR_CHARS else line[: ERROR_CHARS - 3] + "..."
